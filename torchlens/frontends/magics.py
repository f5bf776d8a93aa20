"""IPython magics: ``%%torchprof`` (and the later ``%%gpumem``, ``%ddp_check``).

A magic parses its options completely before the cell runs: a bad option is a
one-line usage error and nothing runs. The cell then runs in the user's
namespace under the capture; if it raises (or is interrupted), what was
captured is shown first and the original exception is re-raised with the
magic's own frames cut from its traceback.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..model import InputError
from .api import SORT_KEYS, torchprof


def _schedule(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0 or values[2] < 1:
        raise UsageError(
            f"--schedule {text!r}: expected WAIT,WARMUP,ACTIVE as three whole "
            "numbers with ACTIVE >= 1, e.g. --schedule 1,1,3"
        )
    return values  # type: ignore[return-value]


def _positive(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{option} {text!r}: expected a whole number >= 1")
    return value


@magics_class
class TorchlensMagics(Magics):
    """The torchlens magics, registered by ``%load_ext torchlens``."""

    @magic_arguments()
    @argument("-o", dest="output", metavar="VAR",
              help="store the result object in variable VAR")
    @argument("--sort", default="total_cpu", metavar="KEY",
              help="op table order: " + ", ".join(SORT_KEYS) + " (default total_cpu)")
    @argument("--top", default="20", metavar="N", help="rows in the op table (default 20)")
    @argument("--shapes", action="store_true",
              help="record input shapes; one table row per op and shape")
    @argument("--stack", action="store_true", help="record Python stacks of ops")
    @argument("--memory", action="store_true", help="record allocations and frees")
    @argument("--flops", action="store_true", help="estimate FLOPs of matmul/conv ops")
    @argument("--schedule", metavar="WAIT,WARMUP,ACTIVE",
              help="profile only some steps; the cell calls torchlens.step() at "
                   "the end of each step")
    @argument("--export", metavar="PATH",
              help="also write PATH: .json/.json.gz Chrome/Perfetto trace, .html "
                   "report, .tlprof saved result")
    @argument("--quiet", action="store_true", help="display nothing")
    @cell_magic
    def torchprof(self, line: str, cell: str) -> None:
        """Run the cell under the PyTorch profiler and show what it spent time on.

        Under the cell: a one-line summary, a sortable op table, a timeline
        with a lane per CPU thread and GPU stream, a per-step breakdown when
        the cell calls ``torchlens.step()``, and hints. Without a GPU, only
        CPU activity is recorded and the report says so.
        """
        args = parse_argstring(self.torchprof, line)
        top = _positive(args.top, "--top")
        schedule = _schedule(args.schedule) if args.schedule else None
        if args.sort not in SORT_KEYS:
            raise UsageError(
                f"--sort {args.sort!r}: use one of {', '.join(SORT_KEYS)}"
            )
        try:
            ctx = torchprof(top=top, sort=args.sort, shapes=args.shapes,
                            stack=args.stack, memory=args.memory, flops=args.flops,
                            schedule=schedule, export=args.export)
        except InputError as err:
            raise UsageError(str(err)) from None
        error: BaseException | None = None
        result = ctx.__enter__()
        try:
            self._run_cell(cell)
        except BaseException as exc:  # KeyboardInterrupt too: show, then re-raise
            error = exc
        ctx.__exit__(type(error) if error else None, error,
                     error.__traceback__ if error else None)
        if args.output:
            self.shell.user_ns[args.output] = result
        if not args.quiet:
            display(result)
        if error is not None:
            raise error.with_traceback(_user_frames(error.__traceback__))

    def _run_cell(self, cell: str) -> None:
        # Compile through IPython's cache so tracebacks show the cell's lines.
        filename = self.shell.compile.cache(cell)
        code = self.shell.compile(cell, filename, "exec")
        exec(code, self.shell.user_ns)  # noqa: S102 - the user's own cell


def _user_frames(tb: Any) -> Any:
    """Drop the leading frames that belong to this module (the magic itself)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def register(ipython: Any) -> None:
    """Register the magics with an IPython shell (``%load_ext torchlens``)."""
    ipython.register_magics(TorchlensMagics)
