"""How a magic runs the user's cell: as IPython runs a cell, under a capture.

``Cell`` compiles the body the way the shell compiles a cell (transformed,
named after its own ``In[N]``, top-level ``await`` allowed); ``run_under``
runs it inside a capture and hands back both the result and the cell's
exception, so the magic can show what was captured before re-raising it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import sys
from collections.abc import Callable, Coroutine
from contextlib import suppress
from pathlib import Path
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parents[2])


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where a live view can be a widget),
    not a script or a terminal IPython."""
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None else None  # type: ignore[attr-defined]
    return shell is not None and getattr(shell, "kernel", None) is not None


def cell_names() -> dict[str, int]:
    """The running shell's cell file names -> In[N] (empty outside IPython).

    A kernel compiles each cell as ``/tmp/ipykernel_<pid>/<hash>.py``; only
    the shell knows which In[N] that was. Captures keep this table with what
    they record (``GpumemPayload.cells``; ``DdpRun.cells``, sent to the ranks
    in processes of their own) to name lines ``cell [N] line L``.
    """
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None else None  # type: ignore[attr-defined]
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return {str(k): int(v) for k, v in names.items()} if isinstance(names, dict) else {}


def execution_count(shell: Any) -> int:
    """The ``In[N]`` of the cell being run (the shell's counter moved on already)."""
    running = getattr(shell.displayhook, "exec_result", None)
    count = getattr(running, "execution_count", None)
    return shell.execution_count if count is None else count


class Cell:
    """A cell body compiled as IPython compiles a cell.

    ``shell.transform_cell`` first (magics, ``!cmd``), then the shell's
    compiler and AST transformers, named ``In[N]`` after the cell being run,
    with top-level ``await`` when the shell's ``autoawait`` is on. A
    SyntaxError is raised here, before any capture starts.
    """

    def __init__(self, shell: Any, raw: str) -> None:
        self.shell = shell
        source = shell.transform_cell(raw)
        self.filename = shell.compile.cache(source, execution_count(shell), raw_code=raw)
        tree = shell.transform_ast(shell.compile.ast_parse(source, filename=self.filename))
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if shell.autoawait else 0
        with shell.compile.extra_flags(flags):
            self.code = shell.compile(tree, self.filename, "exec")
        self.is_async = bool(self.code.co_flags & inspect.CO_COROUTINE)

    def run(self) -> None:
        """Run once in the user's namespace."""
        shell = self.shell
        if self.is_async:
            run_coroutine(shell, eval(self.code, shell.user_global_ns, shell.user_ns))  # noqa: S307
        else:
            exec(self.code, shell.user_global_ns, shell.user_ns)  # noqa: S102 - the user's own cell

    def user_error(self, error: BaseException) -> BaseException:
        """``error`` with the frames before the cell's own cut from its traceback."""
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != self.filename:
            tb = tb.tb_next
        return error.with_traceback(tb if tb is not None else _outside_torchlens(error.__traceback__))


def run_coroutine(shell: Any, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a cell with top-level ``await`` to its end, as the shell would.

    Outside a running event loop (terminal IPython, tests) the shell's own
    ``loop_runner`` runs it. In a kernel the magic is itself called from
    inside the kernel's running loop, which cannot be waited on from here: the
    cell gets an event loop of its own on this thread (the captures record
    this thread), with the kernel's set aside until the cell ends.
    """
    try:
        outer = asyncio.get_running_loop()
    except RuntimeError:
        return shell.loop_runner(coro)
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    asyncio._set_running_loop(None)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # interrupted: cancel what the cell awaits, then report it
            task.cancel()
            with suppress(BaseException):
                loop.run_until_complete(task)
        raise
    finally:
        with suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio._set_running_loop(outer)


def run_under(ctx: Any, cell: Cell, repeat: int = 1,
           between: Callable[[], None] | None = None) -> tuple[Any, BaseException | None]:
    """Run ``cell`` (``repeat`` times) inside the capture ``ctx``; its result and error."""
    error: BaseException | None = None
    result = ctx.__enter__()
    try:
        for i in range(repeat):
            if i and between is not None:
                between()
            cell.run()
    except BaseException as exc:  # KeyboardInterrupt too: show, then re-raise
        error = exc
    ctx.__exit__(type(error) if error else None, error,
                 error.__traceback__ if error else None)
    return result, error


def _outside_torchlens(tb: Any) -> Any:
    """Drop the leading frames that belong to torchlens (the magic and this module)."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return tb
