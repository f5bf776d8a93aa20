"""``%%gpumem`` from Python, and an allocator snapshot file as the same result.

``with torchlens.gpumem(simulate=True) as result:`` records the block's
allocations; ``load_gpumem(path)`` reads a snapshot someone sent. Either way
the ``MemoryResult`` gives the report and the tables (peak, categories,
stages, sites, leaks). A file is read by the compiled reader when it takes it
(``columns_of``): ``peak()`` and ``categories()`` then come from the columns,
and the Profile (``profile_of``, by the Python loader) is made from the same
bytes only when something else of the result is asked for.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from torchlens.formats.file_kind import file_kind
from torchlens.frontends.result import Result, finish
from torchlens.frontends.shared import preload
from torchlens.model import (
    GpumemPayload,
    InputError,
    MemoryOptions,
    Profile,
    load_profile,
)
from torchlens.model.snapshot import Snapshot

if TYPE_CHECKING:  # read only when a file is loaded
    from torchlens.formats.snapshot_columns import SnapshotColumns


def gpumem_options(
    *, device: int = 0, stacks: int = 32, simulate: bool = False, capacity: str | int | None = None,
    alloc_conf: str | None = None, repeat: int = 1, top: int = 15, categories: str = "inferred",
) -> GpumemPayload:
    """The ``%%gpumem`` options, validated, as the payload the user asked for
    (capture fills in what it measured); InputError on bad input. ``categories``:
    ``"inferred"`` (torchlens' stack rules, cheap) or ``"torch"`` (torch's memory
    profiler as well: seconds more per cell).

    Checked before anything runs: a typo in ``--alloc-conf`` or ``--capacity``
    must not cost the user a long cell.
    """
    from torchlens.analysis.memory.allocator import AllocatorConfig
    from torchlens.analysis.memory.what_if import parse_size

    # checks device, stacks and categories
    recorded = MemoryOptions(device=device, stacks=stacks, categories=categories)
    for name, value, low in (("repeat", repeat, 1), ("top", top, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InputError(f"{name} must be a whole number >= {low}, got {value!r}")
    cap = None
    if capacity is not None:
        try:
            cap = capacity if isinstance(capacity, int) else parse_size(capacity)
        except ValueError as err:
            raise InputError(f"capacity {err}") from None
        if cap <= 0:
            raise InputError(f"capacity must be positive, got {capacity!r}")
    if alloc_conf:
        AllocatorConfig.parse(alloc_conf)  # raises InputError with torch's wording
    if (cap is not None or alloc_conf) and not simulate:
        raise InputError("--capacity and --alloc-conf only apply with --simulate "
                         "(in Python: capacity= and alloc_conf= with simulate=True)")
    return GpumemPayload(recorded=recorded, simulate=bool(simulate), capacity=cap,
                         alloc_conf=alloc_conf or "", repeat=repeat, top=top)


def category_options(items: list[str]) -> dict[str, str] | None:
    """``--category NAME=REGEX`` options (``%%gpumem``, ``torchlens report``) as an ordered
    ``{name: regex}``; InputError names the option and the regex that is wrong."""
    import re

    def _unquote(text: str) -> str:  # IPython's splitter keeps the quotes
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            return text[1:-1]
        return text

    out: dict[str, str] = {}
    for item in items:
        name, eq, pattern = _unquote(item).partition("=")
        name = name.strip()
        if not eq or not name or not pattern:
            raise InputError(f"--category {item!r}: expected NAME=REGEX, e.g. "
                             "--category 'attention=attn|softmax'")
        try:
            re.compile(pattern)
        except re.error as err:
            raise InputError(f"--category {name}: bad regex {pattern!r} ({err})") from None
        out[name] = pattern
    return out or None


def _as_asked(captured: GpumemPayload, asked: GpumemPayload) -> GpumemPayload:
    """What capture measured, with what the user asked the analysis to do, and the
    shell's cell numbers (a kernel's cells compile under temp names that lack them)."""
    from torchlens.frontends.shared.cells import cell_names

    return dataclasses.replace(captured, simulate=asked.simulate, capacity=asked.capacity,
                               alloc_conf=asked.alloc_conf, repeat=asked.repeat, top=asked.top,
                               cells=cell_names())


class MemoryResult(Result):
    """A ``gpumem`` result: the Profile plus its ``MemoryAnalysis`` (timeline,
    sites, survivors, fragmentation, diagnosis) as plain objects."""

    #: the user's own categories ({name: regex over frames' file:function}), applied first
    custom_categories: dict[str, str] | None = None

    _peak: Any = None  # ``analysis.memory.analyze.PeakPart``, made once
    #: a loaded file's (columns, payload) (``formats.snapshot_columns``), its Profile's
    #: maker (run on first use of the Profile), and the peak from the columns
    _columns: Any = None
    _made: Any = None
    _fast: Any = None

    @property
    def profile(self) -> Profile:
        if self._profile is None and self._made is not None:
            self._profile, self._made = self._made(), None
        return Result.profile.fget(self)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        if self._made is not None:
            self.profile  # noqa: B018 - a loaded file's Profile, made now
        return super().__repr__()

    def analysis(self) -> Any:
        """The analysis, its peak categorised with ``custom_categories`` when set."""
        if self._analysis is None:
            from torchlens.analysis.memory.analyze import analyze

            self._analysis = analyze(self.profile, categories=self.custom_categories,
                                     part=self._peak_part())
        return self._analysis

    def _peak_part(self) -> Any:
        """The timeline and its peak alone: ``peak()`` and ``categories()`` need no more
        of the report (fragmentation, leaks, the OOM diagnosis), which ``analysis()``
        adds to it."""
        if self._analysis is not None:
            return None
        if self._peak is None:
            from torchlens.analysis.memory.analyze import peak_part

            self._peak = peak_part(self.profile, categories=self.custom_categories)
        return self._peak

    def _peak_analysis(self) -> Any:
        part = self._peak_part()
        return self._analysis.peak if part is None else part.peak

    def _peak_rows(self) -> Any:
        """What ``peak()`` and ``categories()`` show: for a loaded file read by the
        compiled reader, from its columns (the same rows, no dict per trace entry,
        ``analysis.memory.peak_columns``), until the report is made."""
        if self._analysis is None and self._peak is None and self._columns is not None:
            if self._fast is None:
                from torchlens.analysis.memory.categories import compile_custom
                from torchlens.analysis.memory.peak_columns import peak_from_columns

                cols, p = self._columns
                self._fast = peak_from_columns(
                    cols, device=p.recorded.device, alloc_conf=p.alloc_conf,
                    custom=compile_custom(self.custom_categories), cells=p.cells) or False
            if self._fast:
                return self._fast
        return self._peak_analysis()

    def set_categories(self, categories: dict[str, str] | None) -> MemoryResult:
        """Your own categories, matched before torchlens' rules: an ordered
        ``{name: regex}`` over each frame's ``file:function`` (InputError on a bad regex)."""
        from torchlens.analysis.memory.categories import compile_custom

        compile_custom(categories)
        self.custom_categories = dict(categories or {}) or None
        self._analysis = self._peak = self._fast = None
        return self

    def peak(self) -> Any:
        """What was alive at the peak, by site (DataFrame; bytes, share of the peak,
        the categories at the site, the stack of its largest block)."""
        import pandas as pd

        from torchlens.render.memory.peak import stack_text

        rows = self._peak_rows().by_site
        payload = self._columns[1] if self._profile is None and self._columns else \
            self.profile.payload
        cells = dict(payload.cells)  # type: ignore[attr-defined]
        return pd.DataFrame([{"site": r.name, "function": r.function, "categories": r.categories,
                              "bytes": r.bytes, "share": r.share, "blocks": r.count,
                              "stack": stack_text(r.frames, cells)}
                             for r in rows],
                            columns=["site", "function", "categories", "bytes", "share",
                                     "blocks", "stack"])

    def categories(self) -> Any:
        """What was alive at the peak, by category (DataFrame). ``source`` says who named
        each: inferred from the allocating stack (``analysis.memory.categories.RULES``),
        torch's memory profiler (``categories="torch"``) or your regexes."""
        import pandas as pd

        rows = self._peak_rows().by_category
        return pd.DataFrame([{"category": r.name, "bytes": r.bytes, "share": r.share,
                              "blocks": r.count, "source": r.source} for r in rows],
                            columns=["category", "bytes", "share", "blocks", "source"])

    def dtypes(self) -> Any:
        """What was alive at the peak, by dtype (DataFrame: dtype, bytes, share, blocks,
        its categories), as torch's memory profiler saw each tensor: only with
        ``categories="torch"`` (the allocator history records bytes, not dtypes);
        empty otherwise."""
        import pandas as pd

        rows = self._peak_analysis().by_dtype
        return pd.DataFrame([{"dtype": r.name, "bytes": r.bytes, "share": r.share,
                              "blocks": r.count, "categories": r.categories} for r in rows],
                            columns=["dtype", "bytes", "share", "blocks", "categories"])

    def stages(self) -> Any:
        """What was alive at the peak, by the innermost ``record_function`` range open
        when each block was allocated (DataFrame: stage, bytes, share, blocks, its
        categories). Empty when none were recorded; the peak's ``missing`` says why."""
        import pandas as pd

        rows = self._peak_analysis().by_stage
        return pd.DataFrame([{"stage": r.name, "bytes": r.bytes, "share": r.share,
                              "blocks": r.count, "categories": r.categories} for r in rows],
                            columns=["stage", "bytes", "share", "blocks", "categories"])

    def to_json(self) -> dict[str, Any]:
        """The memory figures as plain data, the text view's own: peak, start and end,
        what was alive at the peak (categories, sites, stages), top sites,
        fragmentation, possible leaks, the OOM diagnosis (``analysis.memory.document``)."""
        from torchlens.analysis.memory.document import memory_document

        doc = memory_document(self.analysis(), top=self.profile.payload.top)
        doc.not_measured = list(self.profile.unmeasured)
        return msgspec.to_builtins(doc)

    def diff(self, other: Any, **thresholds: float) -> Any:
        """This result (A) against ``other`` (B: a memory result, a snapshot file or a
        saved ``%%gpumem`` result): peak, start and end, and what was alive at each peak
        by category and site, added / removed / grew / shrank (``MemoryDiffResult``)."""
        from torchlens.frontends.memory.diff import MemoryDiffResult

        b = as_memory(other)
        if b is None:
            raise InputError(f"{other!r:.80}: not a memory result; diff a memory result "
                             "with another one, a snapshot .pickle or a saved %%gpumem .tlprof")
        return MemoryDiffResult.of(self, b, **thresholds)

    def sites(self, n: int = 15) -> list[Any]:
        """Top allocation sites (user file:line) by bytes allocated in the cell."""
        from torchlens.analysis.memory.timeline import top_sites

        return top_sites(self.analysis().timeline, n)

    def leaks(self) -> list[Any]:
        """Sites that left memory behind on two or more passes (possible leaks)."""
        return self.analysis().possible_leaks

    def diagnosis(self) -> Any:
        """The out-of-memory diagnosis, or None when nothing ran out of memory."""
        return self.analysis().diagnosis

    def snapshot(self) -> Snapshot:
        """The allocator snapshot (CPU: the CPU allocator's trace) as typed structs;
        ``.to_torch()`` gives torch's dict format."""
        return next(iter(self.profile.snapshots.values()))


def as_memory(value: Any) -> MemoryResult | None:
    """``value`` as a memory result, or None when it is not one (a run, a trace)."""
    if isinstance(value, MemoryResult):
        return value
    if isinstance(value, Profile):
        return MemoryResult(value) if value.kind == "gpumem" else None
    if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
        kind = file_kind(Path(value))
        if kind == "snapshot":
            return load_gpumem(str(Path(os.fspath(value))))
        if kind == "tlprof":
            from torchlens.formats.input_files import check_zip

            check_zip(value)  # its members' inflated sizes, before any is read
            return as_memory(load_profile(Path(os.fspath(value))))
    return None


class gpumem:  # noqa: N801 - reads as a function in `with torchlens.gpumem():`
    """Record allocations of a block: ``with torchlens.gpumem(simulate=True) as r: ...``.

    Options mirror ``%%gpumem``: ``device``, ``stacks`` (frames kept per
    allocation), ``simulate`` with ``capacity`` ("24GiB") and ``alloc_conf``
    (PYTORCH_CUDA_ALLOC_CONF syntax), ``top``, ``export``, ``categories``
    ("inferred" or "torch": from torch's memory profiler, seconds more) and
    ``custom_categories`` (your ``{name: regex}``, matched first). Without CUDA the
    CPU allocator's events are recorded and the allocator model stands in for
    the GPU's reserved memory, which the result says.
    """

    def __init__(
        self, *, device: int = 0, stacks: int = 32, simulate: bool = False,
        capacity: str | int | None = None, alloc_conf: str | None = None, top: int = 15,
        export: str | None = None, title: str = "", repeat: int = 1,
        categories: str = "inferred", custom_categories: dict[str, str] | None = None,
    ) -> None:
        from torchlens.capture.memory.capture import MemoryCapture
        from torchlens.frontends.export import check_export_path

        self._asked = gpumem_options(device=device, stacks=stacks, simulate=simulate,
                                       capacity=capacity, alloc_conf=alloc_conf, repeat=repeat,
                                       top=top, categories=categories)
        if export:
            check_export_path(export, "gpumem")
        self._export = export
        self.capture = MemoryCapture(self._asked.recorded, title=title)
        # a bad regex fails here, before the block runs
        self.result = MemoryResult().set_categories(custom_categories)
        self._device = device
        self._title = title

    def __enter__(self) -> MemoryResult:
        from torchlens.capture.monitor.process import memory_sampler
        from torchlens.frontends.shared.live_publish import LivePublisher

        preload.wait()  # an import thread would allocate inside the recorded block
        self.capture.__enter__()
        # the GPU Monitor sidebar shows this run's memory while the cell runs
        self._live = LivePublisher(self._title or f"%%gpumem {time.strftime('%H:%M:%S')}",
                                   memory_sampler(self._device)).__enter__()
        return self.result

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._live.__exit__(exc_type, exc, tb)
        self.capture.__exit__(exc_type, exc, tb)
        profile = self.capture.profile
        profile.payload = _as_asked(profile.payload, self._asked)
        finish(self.result, profile, self._export)
        # the sidebar's line becomes the report's figure, and the run is marked finished
        self._live.finish(self.result.analysis, self._device if profile.payload.measured_on
                          == "cuda" else None)
        return False


def load_gpumem(path: str, custom_categories: dict[str, str] | None = None,
                **options: Any) -> MemoryResult:
    """A snapshot file someone sent (``torch.cuda.memory._dump_snapshot``) as a result.

    Loaded with ``load_snapshot``, which refuses every pickle global: the file
    cannot run code. ``options`` as ``gpumem_options`` (simulate, capacity ...);
    ``custom_categories`` as ``MemoryResult.set_categories``.
    """
    import io

    from torchlens.model.snapshot import load_snapshot

    display = gpumem_options(**options)
    if display.recorded.categories == "torch":
        raise InputError("categories 'torch' needs a live capture (torch's memory profiler "
                         "runs while the cell does); a loaded snapshot's categories are "
                         "inferred from its frames")
    result = MemoryResult().set_categories(custom_categories)
    name = os.path.basename(str(path))
    data = snapshot_bytes(path)
    fast = columns_of(data, path)
    if fast is None:
        source = io.BytesIO(data)
        source.name = str(path)  # the loader's messages name the file, as from a path
        result._profile = profile_of(load_snapshot(source), path, name, display)
        return result
    data, cols = fast
    # peak() and categories() read the columns; anything else makes the Profile from
    # the same bytes by the Python loader, once, on first use
    result._columns = (cols, dataclasses.replace(display, measured_on="snapshot"))

    def made() -> Profile:
        source = io.BytesIO(data)
        source.name = str(path)  # the loader's messages name the file, as from a path
        return profile_of(load_snapshot(source), path, name, display)
    result._made = made
    return result


def snapshot_bytes(path: str) -> bytes:
    """A snapshot file's bytes, read through the one guarded open
    (``formats.input_files``: a regular file, no larger than its cap); a
    missing file or a folder gets the snapshot loader's own message."""
    from torchlens.formats.input_files import read_file_bytes
    from torchlens.model.snapshot import load_snapshot

    if not os.path.exists(path) or os.path.isdir(path):
        load_snapshot(path)  # raises its one-line message
    try:
        return read_file_bytes(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def columns_of(data: bytes, path: str) -> tuple[bytes, SnapshotColumns] | None:
    """(the file's bytes, their columns) when the compiled reader takes the file; None
    otherwise (not built, TORCHLENS_NO_NATIVE, a torchlens export, any file it declines:
    the Python loader then reads it and says what is wrong). The settings are checked
    here as the Python loader checks them, so a file fails to load the same either way."""
    from torchlens.formats.gpumem_record import RECORD_KEY
    from torchlens.formats.snapshot_columns import native
    from torchlens.model.snapshot import normalize_snapshot

    if not native.available():
        return None
    cols = native.read(data, RECORD_KEY)
    if cols is None:
        return None
    normalize_snapshot({"segments": [], "allocator_settings": cols.allocator_settings},
                       name=str(path))
    return data, cols


def profile_of(snap: Snapshot, path: str, name: str,
               display: GpumemPayload) -> Profile:
    """The Profile of a loaded snapshot (a %%gpumem export: the capture itself)."""
    from torchlens.formats.gpumem_record import RECORD_KEY, restore

    capture, damaged = restore(snap, display)
    if capture is not None:
        return Profile(kind="gpumem", title=name, source=str(path),
                       snapshots={"file": capture.snapshot}, payload=capture.payload,
                       unmeasured=capture.unmeasured, error=capture.error)
    snap.extra.pop(RECORD_KEY, None)
    return Profile(kind="gpumem", title=name, source=str(path), snapshots={"file": snap},
                   unmeasured=[damaged] if damaged else [],
                   payload=dataclasses.replace(display, measured_on="snapshot"))
