"""A run folder's ``manifest.json``: one typed, versioned record for both writers.

``%ddp_check --profile`` (``capture.ddp.launcher``) and ``torchlens run``
(``frontends.ranks.command``) write the same ``Manifest`` through
``write.write_run_folder``; ``source`` says which, and a field only the other writer knows
is null (or empty). Every reader (``sources.discover``, ``torchlens.watch``,
the sidebar's registry, ``torchlens.load``) goes through ``read_manifest``.

Versions. 1: each writer wrote its own keys by hand, and ``%ddp_check``'s
wrote no ``source``. 2: the typed manifest, every key present. A version-1
file reads as a ``Manifest`` with the keys it lacks at their defaults and,
without ``source``, ``%ddp_check --profile`` (the only writer that left it
out). A newer version is refused: its keys may mean something else.

The records of the analysis (``restarts``, ``lost_nodes``, ``memory_creep``)
are typed here field for field as the analysis writes them (a format does
not import the analysis that defines them); every field has a default, so
an older manifest that lacks one still reads. ``slow_rank`` stays the
analysis' JSON: its finding is ``model.findings.Finding.to_dict``'s, read
back with ``as_finding``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.formats.file_kind import RUN_FORMAT
from torchlens.formats.input_files import RefusedFile, read_capped, world_size_refusal
from torchlens.formats.run_folder.files import MANIFEST
from torchlens.formats.text import first_bad_utf8_byte
from torchlens.model import InputError

#: the version this torchlens writes, and the newest it reads
VERSION = 2
#: ``Manifest.source``: which writer made the folder
SOURCE_DDP_CHECK = "%ddp_check --profile"
SOURCE_RUN = "torchlens run"


class ManifestError(InputError):
    """A ``manifest.json`` that cannot be used; ``str()`` is one line naming the file."""

    def __init__(self, path: str, why: str, foreign: bool = False) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why
        #: valid JSON of some other program (its ``format`` is not a torchlens run's)
        self.foreign = foreign


class RankEntry(msgspec.Struct, kw_only=True):
    """One rank of the run, as the writer saw it when the run ended."""

    rank: int
    #: its profiled-step traces, relative to the run folder, sorted
    traces: list[str] = []
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    #: its allocator snapshot on a CUDA out-of-memory (relative path)
    oom_snapshot: str | None = None
    #: a CUDA out-of-memory, in the rank's own words: where its allocator
    #: snapshot went or why none was saved (cudaMallocAsync, CUDA never
    #: started, the snapshot's error); None when it had none. Added within
    #: version 2: a reader that does not know it ignores it (msgspec drops
    #: unknown keys), so the version stays.
    oom: str | None = None
    # ``torchlens run``: where and how the rank's last start ran and ended
    node: int | None = None
    local_rank: int | None = None
    restart: int | None = None
    state: str | None = None
    error: str | None = None
    stopped_at_step: int | None = None
    last_heartbeat: float | None = None
    #: step records and profiled-step summaries the collector got, every start
    steps: int | None = None
    summaries: int | None = None


class NodeEntry(msgspec.Struct, kw_only=True):
    """``torchlens run``: one machine of the run and its ranks."""

    node: int | None = None
    host: str | None = None
    ranks: list[int] = []


class LiveEntry(msgspec.Struct, kw_only=True):
    """``torchlens run``: what its live feed wrote (``FeedPublisher.manifest_entry``)."""

    feed: str | None = None
    status: str | None = None
    frames: int = 0
    bytes: int = 0
    store_thinned: int = 0
    publish_ms_median: float | None = None
    publish_ms_max: float | None = None
    errors: dict[str, str] = {}


class CollectorEntry(msgspec.Struct, kw_only=True):
    """``torchlens run``: what the ranks sent the collector and what it kept
    (``capture.ranks.collector.Collector.tally``), counted over every start.

    Step records are never overwritten by a rank whose collector is behind
    (it holds them until the collector has read its ring): a batch is lost
    only when a rank exiting wrote over an unread one
    (``step_batches_overwritten``), and records only past a rank's hold
    (``step_records_shed``). A rank whose summaries' ring is full of unread
    ones does not send the next (``summaries_skipped``).
    Profiled-step summaries, when the collector falls behind a rank by
    ``summaries_behind_at`` of them (its ring holds ``summaries_ring``), are
    sampled: from then on it keeps every ``stride``-th summary of each rank
    (by the rank's own count), up to every ``stride_max``-th, and counts the
    others as ``summaries_sampled``. ``words`` says it as one sentence
    (``analysis.ranks.collector_notes.sampling_words``); "" when all was kept.
    Added within version 2 (an older reader ignores it).
    """

    step_batches_sent: int = 0
    step_batches_overwritten: int = 0
    step_records_kept: int = 0
    step_records_shed: int = 0
    summaries_sent: int = 0
    summaries_kept: int = 0
    summaries_sampled: int = 0
    summaries_overwritten: int = 0
    summaries_skipped: int = 0
    stride_max: int = 1
    summaries_behind_at: int = 0
    summaries_ring: int = 0
    words: str = ""


class ProfileEntry(msgspec.Struct):
    """``%ddp_check --profile``'s settings (``ProfileSpec.manifest``): each left
    out of the JSON when not set (``{}``: not a --profile run)."""

    every: int | None | UnsetType = UNSET
    budget: float | None | UnsetType = UNSET
    window_s: float | None | UnsetType = UNSET
    max_steps: int | None | UnsetType = UNSET
    keep: int | None | UnsetType = UNSET


class LostNodeEntry(msgspec.Struct):
    """A node (or ranks of one) that went silent (``analysis.ranks.verdict.LostNode``)."""

    node: int | None = None
    host: str | None = None
    ranks: list[int] = []
    step: int | None = None
    why: str = ""
    words: str = ""
    whole_node: bool = True


class RestartBeforeEntry(msgspec.Struct):
    """One rank of a restart (``analysis.ranks.restarts.RankBefore``)."""

    rank: int = 0
    steps: int | None = None
    restart_count: int | None = None


class RestartEntry(msgspec.Struct):
    """One restart of the job's workers (``analysis.ranks.restarts.Restart``)."""

    number: int | None = None
    ranks: list[int] = []
    world_size: int | None = None
    t: float | None = None
    resumed_t: float | None = None
    cause: str = "unknown"
    cause_rank: int | None = None
    cause_step: int | None = None
    error: str | None = None
    before: list[RestartBeforeEntry] = []
    words: str = ""
    label: str = ""


class CreepEntry(msgspec.Struct):
    """A rank whose memory creeps (``analysis.ranks.steps.MemoryCreep``); an
    older manifest may hold its words alone (the figures None)."""

    rank: int | None = None
    bytes_per_step: float | None = None
    total_bytes: int | None = None
    steps: int | None = None
    source: str | None = None
    words: str = ""
    #: the first and last step fitted (None in an older manifest)
    first_step: int | None = None
    last_step: int | None = None


class Manifest(msgspec.Struct, kw_only=True):
    """``manifest.json`` (field by field: docs/RANK_PROFILE.md, "Run folder")."""

    format: str = RUN_FORMAT
    version: int = VERSION
    source: str = SOURCE_DDP_CHECK
    world_size: int
    created: float | None = None
    ranks: list[RankEntry] = []
    # %ddp_check --profile
    backend: str | None = None
    #: the --profile settings (every, window_s, max_steps, keep), less run_dir
    profile: ProfileEntry = msgspec.field(default_factory=ProfileEntry)
    # torchlens run
    run_id: str | None = None
    command: list[str] = []
    #: when the collector started (unix s): step times are drawn from it
    started: float | None = None
    exit_code: int | None = None
    interrupted: bool = False
    #: where the run stopped, as one sentence ("finished: every rank said goodbye ...")
    stopped: str | None = None
    verdict: str | None = None
    #: the verdict's kind (``Finding.code``: slow_rank, lost_node, failed_rank, ...);
    #: None in a manifest written before it was saved
    verdict_code: str | None = None
    #: the ranks the verdict names (``Finding.ranks``: the failed rank, the ranks
    #: whose memory creeps); empty when it names none or in an older manifest
    verdict_ranks: list[int] = []
    nodes: list[NodeEntry] = []
    lost_nodes: list[LostNodeEntry] = []
    restarts: list[RestartEntry] = []
    slow_rank: dict[str, Any] | None = None
    memory_creep: list[CreepEntry] = []
    #: messages to the collector dropped (failed signature or shape), and why
    dropped_messages: int = 0
    dropped_why: dict[str, int] = {}
    notes: list[str] = []
    live: LiveEntry | None = None
    #: what the ranks sent the collector and what it kept (sampled summaries)
    collector: CollectorEntry | None = None

    def rank(self, rank: int) -> RankEntry | None:
        """The entry of ``rank``, None when the manifest has none."""
        return next((e for e in self.ranks if e.rank == rank), None)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as the JSON it is written as."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def _plain(obj: Any) -> Any:
    """What the JSON holds for a value msgspec does not encode: a numpy scalar's
    value, else its text (as ``json.dump(default=str)`` did)."""
    item = getattr(obj, "item", None)
    if callable(item):
        value = item()
        if isinstance(value, (int, float, bool, str)):
            return value
    return str(obj)


def write_manifest(run_dir: str, manifest: Manifest) -> str:
    """Write ``RUN_DIR/manifest.json`` whole (a reader never sees half of it); its path.

    The manifest is read back before it replaces the file: a field of the
    wrong type is a bug here, not a folder no reader can open.
    """
    data = msgspec.json.format(msgspec.json.encode(manifest, enc_hook=_plain), indent=1)
    msgspec.json.decode(data, type=Manifest)
    path = os.path.join(run_dir, MANIFEST)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk leaves no partial file behind
            os.unlink(tmp)
        raise
    return path


def read_manifest(run_dir: str, private: bool = False) -> Manifest:
    """``RUN_DIR/manifest.json``, version 1 or 2; a ``ManifestError`` (an InputError,
    one line naming the file and what is wrong) when it is missing, not JSON,
    not a torchlens run's, of a newer version or of the wrong shape.

    ``private``: only a regular file of this user, not through a link (the
    Jupyter server reads folders named in its registry). Either way a manifest
    that leads out of the folder (a link) is refused (``input_files.open_guarded``).
    """
    return load_manifest(os.path.join(run_dir, MANIFEST), private, within=run_dir)


def load_manifest(path: str, private: bool = False, within: str | None = None) -> Manifest:
    """``read_manifest`` of a manifest file's own path; ``within``: refused unless
    the file opened lies in that folder (``input_files.open_guarded``)."""
    try:
        data = read_capped(path, private=private, within=within)
    except RefusedFile as exc:
        raise ManifestError(path, f"refused: {exc.why}") from None
    except FileNotFoundError:
        raise ManifestError(path, "no such file: the folder holds no torchlens run "
                            "(or the run ended before its folder was written)") from None
    except OSError as exc:
        raise ManifestError(path, f"cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ManifestError(path, f"cannot read it ({exc})") from None
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        bad = first_bad_utf8_byte(data)
        if bad is not None:  # a changed byte in a string
            raise ManifestError(path, f"not UTF-8 text (byte {bad}): the file is "
                                "damaged; the run's traces can still be read as a "
                                "folder of traces once it is removed") from None
        raise ManifestError(path, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != RUN_FORMAT:
        what = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ManifestError(path, f"not a torchlens run manifest (format {what!r}, not "
                            f"{RUN_FORMAT!r})", foreign=True)
    version = doc.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ManifestError(path, f"its version {version!r} is not a version number")
    if version > VERSION:
        raise ManifestError(path, f"manifest version {version}, written by a newer "
                            f"torchlens (this one reads up to {VERSION}): upgrade torchlens")
    if version == 1:
        doc.setdefault("source", SOURCE_DDP_CHECK)
    try:
        manifest = msgspec.convert(doc, Manifest)
    except msgspec.ValidationError as exc:
        raise ManifestError(path, f"not a valid torchlens run manifest ({exc})") from None
    # a declared count is checked before any reader makes a list of that many ranks
    too_many = world_size_refusal(manifest.world_size)
    if too_many is not None:
        raise ManifestError(path, f"refused: {too_many}")
    return manifest


def folder_of_manifest(path: str | os.PathLike[str]) -> str | None:
    """The run folder whose ``manifest.json`` ``path`` is, None for any other path
    (a user who names the manifest means the run; as a trace it is none)."""
    path = os.fspath(path)
    if os.path.basename(path) != MANIFEST or not os.path.isfile(path):
        return None
    root = os.path.dirname(os.path.abspath(path))
    try:
        read_manifest(root)
    except ManifestError:
        return None
    return root
