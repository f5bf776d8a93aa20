"""IPython magics: ``%%torchprof``, ``%%gpumem`` / ``%gpumem --load``, ``%ddp_check``, ``%gpumonitor``.

A magic parses its options completely before the cell runs: a bad option is a
one-line usage error and nothing runs. Options are parsed one way for every
magic (``_parse``: IPython's ``magic_arguments``, quotes dropped from every
value); the magic only turns text into numbers (``_number``) and leaves the
checking to the API it calls, whose InputError becomes the UsageError
(``_usage_errors``).

The cell runs as IPython runs a cell (``cells.Cell``): transformed (``%time``,
``!cmd``), compiled under the cell's own ``In[N]`` name, top-level ``await``
allowed, in the user's namespace under the capture. If it raises (or is
interrupted), what was captured is shown first and the original exception is
re-raised with the frames before the cell's own cut from its traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

from torchlens.analysis.trace.ops import SORT_NAMES
from torchlens.frontends import kinds
from torchlens.frontends.shared.cells import Cell, execution_count, run_under
from torchlens.frontends.shared.options import unrecognized
from torchlens.frontends.trace.api import torchprof
from torchlens.model import InputError

#: API parameters whose InputError message starts with their name; the magic
#: spells them as its option (``top must be ...`` -> ``--top must be ...``).
_PARAMETERS = frozenset({
    "top", "sort", "schedule", "device", "stacks", "repeat", "capacity", "alloc_conf",
    "world_size", "backend", "timeout", "steps", "interval", "minutes", "duration",
    "nnodes", "nproc_per_node", "rdzv_endpoint", "host", "categories",
})


def _unquote(text: str) -> str:
    """IPython's argument splitter keeps the quotes around a value; drop them."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _parse(magic: Callable[..., Any], line: str, name: str) -> Any:
    """A magic's options (its ``magic_arguments``), every string without its quotes.

    So ``--export "my file.html"`` is the path ``my file.html``. A usage error
    names the magic: ``%%torchprof: unrecognized arguments: --bogus``.
    """
    try:
        args = parse_argstring(magic, line)
    except UsageError as err:
        said = str(err)
        parser = getattr(magic, "parser", None)
        if said.startswith("unrecognized arguments:") and parser is not None:
            said = unrecognized(said.split(":", 1)[1].split(), parser)  # "did you mean"
        raise UsageError(f"{name}: {said}") from None
    paths = getattr(args, "export", None)
    if isinstance(paths, list):  # ``append``: a second --export is not silently dropped
        if len(paths) > 1:
            raise UsageError(f"{name}: --export given {len(paths)} times ("
                             + ", ".join(_unquote(x) for x in paths) + "): give it once and "
                             "write the others from the result (-o r, then r.export(PATH))")
        args.export = paths[0]
    for key, value in vars(args).items():
        if isinstance(value, str):
            setattr(args, key, _unquote(value))
    return args


def _number(text: str, option: str, kind: type = int) -> Any:
    """An option's text as ``kind`` (int or float); its range is the API's to check."""
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InputError(f"{option} {text!r}: expected {what}") from None


def _schedule(text: str | None) -> tuple[int, ...] | None:
    """``--schedule 1,1,3`` as numbers; ProfilerOptions checks their count and range."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"--schedule {text!r}: expected WAIT,WARMUP,ACTIVE as three whole "
                         "numbers, e.g. --schedule 1,1,3") from None


@contextmanager
def _usage_errors(name: str) -> Iterator[None]:
    """The API's InputError as the magic's UsageError, with option spellings."""
    try:
        yield
    except InputError as err:
        message = str(err)
        head = message.split(" ", 1)[0].rstrip(":")
        if head in _PARAMETERS:
            message = "--" + head.replace("_", "-") + message[len(head):]
        raise UsageError(f"{name}: {message}") from None


def _outputs(kind: str) -> Callable[[Any], Any]:
    """``-o VAR``, ``--export PATH`` and ``--quiet``: where a magic's result goes.
    The formats ``--export`` lists are the kind's own (``kinds.export_suffixes``)."""
    formats = "; ".join(f"{suffix} {kinds.EXPORT_FORMATS[suffix]}"
                        for suffix in kinds.export_suffixes(kind))
    options = (argument("-o", dest="output", metavar="VAR",
                        help="store the result object in variable VAR"),
               argument("--export", metavar="PATH", action="append",
                        help=f"also write PATH (once): {formats}"),
               argument("--quiet", action="store_true", help="display nothing"))

    def apply(magic: Any) -> Any:
        for option in reversed(options):
            magic = option(magic)
        return magic

    return apply


@magics_class
class TorchlensMagics(Magics):
    """The torchlens magics, registered by ``%load_ext torchlens``."""

    @magic_arguments()
    @_outputs("torchprof")
    @argument("--sort", default="total_cpu", metavar="KEY",
              help="op table order: " + ", ".join(SORT_NAMES) + " (default total_cpu)")
    @argument("--top", default="20", metavar="N", help="rows in the op table (default 20)")
    @argument("--shapes", action="store_true",
              help="record input shapes; one table row per op and shape")
    @argument("--stack", action="store_true", help="record Python stacks of ops")
    @argument("--memory", action="store_true", help="record allocations and frees")
    @argument("--flops", action="store_true", help="estimate FLOPs of matmul/conv ops")
    @argument("--schedule", metavar="WAIT,WARMUP,ACTIVE",
              help="profile only some steps; the cell calls torchlens.step() at "
                   "the end of each step")
    @cell_magic
    def torchprof(self, line: str, cell: str) -> None:
        """Run the cell under the PyTorch profiler and show what it spent time on.

        Under the cell: a one-line summary, a sortable op table, a timeline
        with a lane per CPU thread and GPU stream, a per-step breakdown when
        the cell calls ``torchlens.step()``, and hints. Without a GPU, only
        CPU activity is recorded and the report says so.
        """
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of tracebacks
        args = _parse(self.torchprof, line, "%%torchprof")
        with _usage_errors("%%torchprof"):
            ctx = torchprof(top=_number(args.top, "--top"), sort=args.sort, shapes=args.shapes,
                            stack=args.stack, memory=args.memory, flops=args.flops,
                            schedule=_schedule(args.schedule), export=args.export)
        code = Cell(self.shell, cell)
        result, error = run_under(ctx, code)
        self._show(result, args)
        if error is not None:
            raise code.user_error(error)

    @magic_arguments()
    @_outputs("gpumem")
    @argument("--device", default="0", metavar="N", help="CUDA device ordinal (default 0)")
    @argument("--stacks", default="32", metavar="DEPTH",
              help="Python frames kept per allocation; 0 records no stacks (default 32)")
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
    @argument("--categories", default="inferred", metavar="inferred|torch",
              help="who names what was alive at the peak: inferred (torchlens' rules on the "
                   "allocating stack, default) or torch (torch's memory profiler as well: "
                   "seconds more per cell)")
    @argument("--category", action="append", default=[], metavar="NAME=REGEX",
              help="your own category, matched first against each frame's file:function; "
                   "repeat for more, first match wins")
    @argument("--load", metavar="SNAPSHOT",
              help="line form: analyse a snapshot file (torch.cuda.memory._dump_snapshot) "
                   "instead of running a cell; the file cannot run code")
    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> None:
        """Record the cell's allocations: memory timeline, top sites, leaks, fragmentation.

        If the cell runs out of memory, a diagnosis (fragmentation or real
        exhaustion, and what to try with the figure behind it) is shown above
        the re-raised error. Without CUDA, the CPU allocator's events are
        recorded and the CUDA caching-allocator model supplies reserved memory
        and fragmentation, which the report says.
        """
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of tracebacks
        from torchlens.frontends.export import check_export_path
        from torchlens.frontends.memory.api import (
            category_options,
            gpumem_options,
            load_gpumem,
        )
        from torchlens.frontends.memory.api import gpumem as gpumem_ctx

        name = "%gpumem" if cell is None else "%%gpumem"
        args = _parse(self.gpumem, line, name)
        with _usage_errors(name):
            repeat = _number(args.repeat, "--repeat")
            opts = {"device": _number(args.device, "--device"),
                    "stacks": _number(args.stacks, "--stacks"), "simulate": args.simulate,
                    "capacity": args.capacity, "alloc_conf": args.alloc_conf,
                    "top": _number(args.top, "--top")}
            gpumem_options(repeat=repeat, categories=args.categories, **opts)
            custom = category_options(args.category)
            if cell is None:
                if not args.load:
                    raise InputError("needs --load SNAPSHOT (or use %%gpumem on a cell)")
                if args.export:
                    check_export_path(args.export, "gpumem")
                result = load_gpumem(args.load, custom_categories=custom,
                                     categories=args.categories, **opts)
                if args.export:
                    result.export(args.export)
            elif args.load:
                raise InputError("--load analyses a file; use it as %gpumem --load FILE, not on a cell")
            else:
                ctx = gpumem_ctx(repeat=repeat, export=args.export, categories=args.categories,
                                 custom_categories=custom, **opts)
        if cell is None:
            self._show(result, args)
            return
        code = Cell(self.shell, cell)
        result, error = run_under(ctx, code, repeat, ctx.capture.mark_run)
        self._show(result, args)
        if error is not None:
            raise code.user_error(error)

    @magic_arguments()
    @argument("func", nargs="?", metavar="FUNC",
              help="line form: the notebook function to run on every rank, called as "
                   "FUNC(rank, world_size) (or with keywords rank, world_size, device)")
    @argument("--world-size", default=None, metavar="N", help="number of ranks (default 2)")
    @argument("--nnodes", default=None, metavar="N",
              help="run under torch's elastic agent (torchrun) as one node of N; prints the "
                   "command every other node runs; world size N x --nproc-per-node")
    @argument("--nproc-per-node", dest="nproc_per_node", default=None, metavar="K",
              help="with --nnodes: ranks on each node")
    @argument("--rdzv-endpoint", dest="rdzv_endpoint", default=None, metavar="HOST:PORT",
              help="with --nnodes: where the agents meet (c10d rendezvous; this machine's "
                   "address and a free port)")
    @argument("--host", default=None, metavar="IFACE",
              help="with --nnodes: the address or interface the kernel's store listens on "
                   "(default 127.0.0.1: name one when other nodes are other machines)")
    @argument("--backend", default="auto", metavar="auto|gloo|nccl",
              help="auto: nccl when every rank has a GPU, else gloo")
    @argument("--timeout", default="30", metavar="S",
              help="seconds without progress on any rank before it counts as a hang")
    @argument("--steps", default=None, metavar="N",
              help="runs of the step from the same seeds (default 2: checks determinism); "
                   "with --profile: stop every rank after N torchlens.step() calls")
    @argument("--strict", action="store_true",
              help="compare each collective across ranks before it runs")
    @argument("--profile", action="store_true",
              help="profile the ranks while they run: FUNC is the training loop and calls "
                   "torchlens.step() after each step; step times, the slow rank, memory "
                   "and fragmentation every step, torch.profiler on one step in N (N chosen "
                   "to cost at most 3%% of step time, at least 5)")
    @argument("--profile-every", dest="profile_every", default=None, metavar="N",
              help="with --profile: profile exactly one step in N")
    @argument("--profile-window", dest="profile_window", default="1", metavar="S",
              help="with --profile, for code that never calls torchlens.step(): "
                   "seconds per window (default 1)")
    @argument("--run-dir", dest="run_dir", default=None, metavar="DIR",
              help="with --profile: the run folder for every rank's traces "
                   "(default ./torchlens-runs/<name>-<time>)")
    @argument("--no-live", dest="no_live", action="store_true",
              help="no live per-rank plot while the ranks run")
    @argument("--metrics", action="store_true",
              help="with --profile: the per-rank series (docs/METRICS.md) on the Jupyter "
                   "server's /metrics while the ranks run")
    @_outputs("ddp_check")
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
        from torchlens.frontends.ddp.api import (
            check_nodes,
            check_options,
            run_ddp_check,
        )

        name = "%ddp_check" if cell is None else "%%ddp_check"
        args = _parse(self.ddp_check, line, name)
        fn = None
        with _usage_errors(name):
            world_size = 2 if args.world_size is None else _number(args.world_size, "--world-size")
            nnodes = None if args.nnodes is None else _number(args.nnodes, "--nnodes")
            nproc = (None if args.nproc_per_node is None
                     else _number(args.nproc_per_node, "--nproc-per-node"))
            spec = check_nodes(nnodes, nproc, args.rdzv_endpoint, args.host, strict=args.strict)
            if spec is not None:
                if args.world_size is not None and world_size != spec.world_size:
                    raise InputError(f"--world-size {world_size} but --nnodes {nnodes} x "
                                     f"--nproc-per-node {nproc} is {spec.world_size}: "
                                     "drop --world-size")
                world_size = spec.world_size
            steps = None if args.steps is None else _number(args.steps, "--steps")
            timeout = _number(args.timeout, "--timeout", float)
            every = (None if args.profile_every is None
                     else _number(args.profile_every, "--profile-every"))
            window = _number(args.profile_window, "--profile-window", float)
            profile = args.profile or every is not None
            check_options(world_size, args.backend, timeout, steps, args.export,
                          profile=profile, profile_every=every, profile_window=window,
                          run_dir=args.run_dir,
                          local_ranks=spec.nproc_per_node if spec else None)
            if cell is None:
                if not args.func:
                    raise InputError("needs a function: %ddp_check FUNC --world-size 2 "
                                     "(or use %%ddp_check on a cell)")
                fn = self._lookup(args.func)
            elif args.func:
                raise InputError(f"%%ddp_check runs the cell; drop {args.func!r} from the line")
        if cell is None:
            filename = "<ddp_check cell>"
        else:  # the ranks run the cell as written, named after this cell's In[N]
            filename = self.shell.compile.cache(cell, execution_count(self.shell))
        with _usage_errors(name):
            result, interrupted = run_ddp_check(
                fn, world_size=world_size, backend=args.backend, timeout=timeout,
                steps=steps, strict=args.strict, live=not (args.no_live or args.quiet),
                profile=profile, profile_every=every, profile_window=window,
                run_dir=args.run_dir, nnodes=nnodes, nproc_per_node=nproc,
                rdzv_endpoint=args.rdzv_endpoint, host=args.host,
                export=args.export, show=not args.quiet, cell=cell, cell_filename=filename,
                namespace=self.shell.user_ns, metrics=args.metrics)
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

    @magic_arguments()
    @argument("--interval", default="1", metavar="S",
              help="seconds between samples, 0.1 to 60 (default 1)")
    @argument("--minutes", default="5", metavar="M", help="minutes of history shown (default 5)")
    @argument("--duration", default="0", metavar="S",
              help="stop after S seconds; 0 runs until Stop is pressed (default 0)")
    @line_magic
    def gpumonitor(self, line: str) -> Any:
        """Live GPU and host monitor inline (for front ends without the sidebar).

        Without a GPU it says why and still shows the host's CPU and RAM.
        Returns the running monitor (``mon = %gpumonitor``; ``mon.stop()``).
        """
        from torchlens.frontends.monitor.gpumonitor import (
            gpumonitor_magic,
            monitor_options,
        )

        args = _parse(self.gpumonitor, line, "%gpumonitor")
        with _usage_errors("%gpumonitor"):
            opts = monitor_options(interval=_number(args.interval, "--interval", float),
                                   minutes=_number(args.minutes, "--minutes", float),
                                   duration=_number(args.duration, "--duration", float))
        return gpumonitor_magic(**opts)


def register(ipython: Any) -> None:
    """Register the magics with an IPython shell (``%load_ext torchlens``)."""
    ipython.register_magics(TorchlensMagics)
