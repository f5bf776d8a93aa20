"""IPython magics: ``%%torchprof``, ``%%gpumem`` / ``%gpumem --load`` (and later ``%ddp_check``).

A magic parses its options completely before the cell runs: a bad option is a
one-line usage error and nothing runs. The cell then runs in the user's
namespace under the capture; if it raises (or is interrupted), what was
captured is shown first and the original exception is re-raised with the
magic's own frames cut from its traceback.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    cell_magic,
    line_cell_magic,
    line_magic,
    magics_class,
)
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..analysis.ops import SORT_KEYS
from ..model import InputError
from .api import torchprof


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


def _whole(text: str, option: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise UsageError(f"{option} {text!r}: expected a whole number >= {low}")
    return value


def _unquote(text: str | None) -> str | None:
    """IPython's argument splitter keeps the quotes around a value; drop them."""
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


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

    @magic_arguments()
    @argument("-o", dest="output", metavar="VAR", help="store the result object in variable VAR")
    @argument("--device", default="0", metavar="N", help="CUDA device ordinal (default 0)")
    @argument("--stacks", default="32", metavar="DEPTH",
              help="Python frames kept per allocation; 0 records no stacks (default 32)")
    @argument("--export", metavar="PATH",
              help="also write PATH: .pickle snapshot (torch's format, for memory_viz), "
                   ".html report, .tlprof saved result")
    @argument("--simulate", action="store_true",
              help="replay the allocations through the CUDA caching-allocator model: on CPU "
                   "what the GPU allocator would do, on a GPU a side-by-side what-if")
    @argument("--capacity", metavar="SIZE", help="with --simulate: device memory, e.g. 24GiB")
    @argument("--alloc-conf", dest="alloc_conf", metavar="CONF",
              help='with --simulate: PYTORCH_CUDA_ALLOC_CONF to try, e.g. '
                   '"expandable_segments:True,max_split_size_mb:128"')
    @argument("--repeat", default="1", metavar="N",
              help="run the cell N times and report the memory growth per run (leak test)")
    @argument("--top", default="15", metavar="N", help="rows in the site and leak tables")
    @argument("--load", metavar="SNAPSHOT",
              help="line form: analyse a snapshot file (torch.cuda.memory._dump_snapshot) "
                   "instead of running a cell; the file cannot run code")
    @argument("--quiet", action="store_true", help="display nothing")
    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> None:
        """Record the cell's allocations: memory timeline, top sites, leaks, fragmentation.

        If the cell runs out of memory, a diagnosis (fragmentation or real
        exhaustion, and what to try with the figure behind it) is shown above
        the re-raised error. Without CUDA, the CPU allocator's events are
        recorded and the CUDA caching-allocator model supplies reserved memory
        and fragmentation, which the report says.
        """
        from .api import gpumem as gpumem_ctx
        from .api import gpumem_options, load_gpumem
        from .export import check_export_path

        args = parse_argstring(self.gpumem, line)
        device = _whole(args.device, "--device", 0)
        stacks = _whole(args.stacks, "--stacks", 0)
        repeat = _positive(args.repeat, "--repeat")
        top = _positive(args.top, "--top")
        opts = {"device": device, "stacks": stacks, "simulate": args.simulate,
                "capacity": _unquote(args.capacity), "alloc_conf": _unquote(args.alloc_conf),
                "top": top}
        try:
            gpumem_options(repeat=repeat, **opts)
            if args.export:
                check_export_path(args.export, "gpumem")
            if cell is None:
                if not args.load:
                    raise InputError("%gpumem needs --load SNAPSHOT (or use %%gpumem on a cell)")
                result = load_gpumem(args.load, **opts)
                if args.export:
                    result.export(args.export)
            elif args.load:
                raise InputError("--load analyses a file; use it as %gpumem --load FILE, not on a cell")
        except InputError as err:
            raise UsageError(str(err)) from None
        if cell is None:
            self._show(result, args)
            return
        ctx = gpumem_ctx(repeat=repeat, export=args.export, **opts)
        error: BaseException | None = None
        result = ctx.__enter__()
        try:
            for i in range(repeat):
                if i:
                    ctx.capture.mark_run()
                self._run_cell(cell)
        except BaseException as exc:  # an OOM or KeyboardInterrupt too: show, then re-raise
            error = exc
        ctx.__exit__(type(error) if error else None, error,
                     error.__traceback__ if error else None)
        self._show(result, args)
        if error is not None:
            raise error.with_traceback(_user_frames(error.__traceback__))

    @magic_arguments()
    @argument("func", nargs="?", metavar="FUNC",
              help="line form: the notebook function to run on every rank, called as "
                   "FUNC(rank, world_size) (or with keywords rank, world_size, device)")
    @argument("--world-size", default="2", metavar="N", help="number of ranks (default 2)")
    @argument("--backend", default="auto", metavar="auto|gloo|nccl",
              help="auto: nccl when every rank has a GPU, else gloo")
    @argument("--timeout", default="30", metavar="S",
              help="seconds without progress on any rank before it counts as a hang")
    @argument("--steps", default="2", metavar="N",
              help="runs of the step from the same seeds (2 checks determinism)")
    @argument("--strict", action="store_true",
              help="compare each collective across ranks before it runs")
    @argument("--no-live", dest="no_live", action="store_true",
              help="no live per-rank plot while the ranks run")
    @argument("-o", dest="output", metavar="VAR", help="store the result object in VAR")
    @argument("--export", metavar="PATH", help="also write PATH: .html report or .tlprof")
    @argument("--quiet", action="store_true", help="display nothing")
    @line_cell_magic
    def ddp_check(self, line: str, cell: str | None = None) -> None:
        """Run a function (or this cell) on N spawned ranks and check it for DDP bugs.

        The checklist names the first collective where ranks diverge (index,
        op, shapes, dtypes, line), hangs with each rank's Python stack,
        parameters out of sync, nondeterminism, memory imbalance, crashed
        ranks and inconsistent rendezvous variables. In the cell form the
        body runs on every rank with ``rank``, ``world_size`` and ``device``
        defined. No worker outlives the check, also when interrupted.
        """
        from .ddp_api import check_options, run_ddp_check

        args = parse_argstring(self.ddp_check, line)
        world_size = _positive(args.world_size, "--world-size")
        steps = _positive(args.steps, "--steps")
        try:
            timeout = float(args.timeout)
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise UsageError(f"--timeout {args.timeout!r}: expected seconds > 0")
        export = args.export
        if export and len(export) >= 2 and export[0] == export[-1] and export[0] in "\"'":
            export = export[1:-1]  # IPython's splitter keeps the quotes
        fn = None
        try:
            check_options(world_size, args.backend, timeout, steps, export)
            if cell is None:
                if not args.func:
                    raise InputError("%ddp_check needs a function: %ddp_check FUNC --world-size 2 "
                                     "(or use %%ddp_check on a cell)")
                fn = self._lookup(args.func)
            elif args.func:
                raise InputError(f"%%ddp_check runs the cell; drop {args.func!r} from the line")
        except InputError as err:
            raise UsageError(str(err)) from None
        filename = self.shell.compile.cache(cell) if cell is not None else "<ddp_check cell>"
        try:
            result, interrupted = run_ddp_check(
                fn, world_size=world_size, backend=args.backend, timeout=timeout,
                steps=steps, strict=args.strict, live=not (args.no_live or args.quiet),
                export=export, show=not args.quiet, cell=cell, cell_filename=filename,
                namespace=self.shell.user_ns)
        except InputError as err:
            raise UsageError(str(err)) from None
        if args.output:
            self.shell.user_ns[args.output] = result
        if interrupted:
            raise KeyboardInterrupt

    def _lookup(self, name: str) -> Any:
        head, *rest = name.split(".")
        if head not in self.shell.user_ns:
            raise InputError(f"{name!r} is not defined in the notebook")
        obj = self.shell.user_ns[head]
        for attr in rest:
            obj = getattr(obj, attr)
        return obj

    def _show(self, result: Any, args: Any) -> None:
        if args.output:
            self.shell.user_ns[args.output] = result
        if not args.quiet:
            display(result)

    @line_magic
    def gpumonitor(self, line: str) -> Any:
        """Live GPU and host monitor inline (for front ends without the sidebar).

        ``%gpumonitor [--interval S] [--minutes M] [--duration S]``; duration 0
        runs until Stop is pressed. Without a GPU it says why and still shows
        the host's CPU and RAM.
        """
        from .gpumonitor import gpumonitor_magic

        try:
            return gpumonitor_magic(line)
        except SystemExit:  # argparse already printed the usage error
            raise UsageError(f"%gpumonitor {line}: bad option (see %gpumonitor?)") from None

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
