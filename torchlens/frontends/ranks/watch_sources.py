"""Where ``torchlens.watch`` reads a run from (``open_source``): a run
folder's live feed (tailed), a finished folder without one (``folder_frame``:
its final state from its files), or the collector's address (its store,
with the run's secret). Each gives ``watch.Watch`` the same frames.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any

from torchlens.model import InputError
from torchlens.model.records import StepRecord

if TYPE_CHECKING:
    from torchlens.capture.ranks.feed import FrameBeat, LiveFrame

#: host:port (a name, an IPv4 address or a bracketed IPv6 address)
ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")
#: a finished folder's RSS points per rank (from its step records)
FOLDER_BEATS = 2000


def open_source(target: Any, secret_file: str | None, run_id: str | None,
          timeout: float) -> tuple[Any, str, str]:
    """(the feed reader, a label, a note) for ``target``; InputError saying what to do."""
    if not isinstance(target, (str, os.PathLike)):
        raise InputError(f"torchlens.watch takes a run folder or 'host:port', got {target!r}")
    text = os.fspath(target)
    if os.path.isdir(text):
        return _folder(text)
    match = ADDRESS.match(text)
    if match and not os.path.exists(text):
        return _address(match.group(1).strip("[]"), int(match.group(2)), secret_file, run_id,
                        timeout)
    if os.path.exists(text):
        raise InputError(f"{text} is a file: torchlens.watch takes a `torchlens run` folder "
                         "(its --out) or the collector's host:port")
    raise InputError(f"{text!r}: no such folder, and not host:port; pass the run folder "
                     "(`torchlens run --out DIR`) or the address it printed")


def _folder(run_dir: str) -> tuple[Any, str, str]:
    from torchlens.capture.ranks.feed import FileFeed
    from torchlens.formats.run_folder.files import (
        LIVE_FEED,
        MANIFEST,
        SECRET_FILE,
        SPOOL_DIR,
    )

    label = os.path.abspath(run_dir)
    has = {name: os.path.exists(os.path.join(run_dir, name))
           for name in (LIVE_FEED, MANIFEST, SPOOL_DIR, SECRET_FILE)}
    if has[LIVE_FEED]:
        note = ("this run has ended: its live feed is replayed; torchlens.load(RUN_DIR) gives "
                "the full report" if has[MANIFEST] else "")
        return FileFeed(run_dir), label, note
    if has[MANIFEST]:
        return FolderFinal(run_dir), label, (
            f"this run has ended ({MANIFEST}) and has no live feed: showing its final "
            "state from the folder; torchlens.load(RUN_DIR) gives the full report")
    if has[SPOOL_DIR] or has[SECRET_FILE]:  # a run starting: its first frame is due
        return FileFeed(run_dir), label, ""
    raise InputError(f"{run_dir} is not a `torchlens run` folder (no {LIVE_FEED}, no "
                     f"{MANIFEST}): pass the --out folder of `torchlens run`, or the "
                     "collector's host:port")


def _key_secret(secret_file: str | None, run_id: str | None) -> tuple[bytes, str | None]:
    from torchlens.capture.channel.signing import (
        ENV_RUN_ID,
        ENV_SECRET,
        ENV_SECRET_FILE,
        RunKey,
    )

    env = dict(os.environ)
    run_id = run_id or env.get(ENV_RUN_ID) or None
    if secret_file is not None:
        env = {ENV_SECRET_FILE: os.fspath(secret_file)}
    env[ENV_RUN_ID] = run_id or "-"  # RunKey wants one; the collector tells the real one
    how = ("pass secret_file= the run's run.secret (torchlens run writes it in the run "
           f"folder; copy it, mode 0600), or set {ENV_SECRET_FILE}")
    if not env.get(ENV_SECRET_FILE) and not env.get(ENV_SECRET):
        raise InputError(f"watching a collector's address needs the run's secret: {how}")
    try:
        key = RunKey.from_env(env)
    except FileNotFoundError as exc:
        raise InputError(f"the secret file {exc.filename} does not exist: {how}") from None
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from None
    if key is None:
        raise InputError(f"the run's secret is empty: {how}")
    return key.secret, run_id


def _address(host: str, port: int, secret_file: str | None, run_id: str | None,
             timeout: float) -> tuple[Any, str, str]:
    from torchlens.capture.channel.signing import Forged
    from torchlens.capture.ranks.feed import StoreFeed

    secret, run_id = _key_secret(secret_file, run_id)
    where = f"{host}:{port}"
    try:
        feed = StoreFeed.connect(host, port, secret, run_id, timeout=min(timeout, 10.0))
    except ConnectionError as exc:
        raise InputError(f"{exc}: is the `torchlens run` still running, and is this the "
                         "collector address it printed? (after the run: "
                         "torchlens.watch(RUN_DIR) or torchlens.load(RUN_DIR))") from None
    except LookupError as exc:
        raise InputError(f"{exc}: pass the address `torchlens run` printed") from None
    except Forged as exc:
        raise InputError(f"{exc}; pass this run's run.secret (secret_file=)") from None
    return feed, f"{where} (run {feed.key.run_id})", ""


class FolderFinal:
    """A finished run folder without a live feed: one frame made from its files."""

    dropped = 0
    full_summaries = True  # its summaries have their ops: the timeline is drawn

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._done = False

    def read(self) -> list[LiveFrame]:
        if self._done:
            return []
        self._done = True
        return [folder_frame(self.run_dir)]

    def finished(self) -> None:
        pass

    def close(self) -> None:
        pass


def folder_frame(run_dir: str) -> LiveFrame:
    """A finished run folder as one (ended) frame: every step and summary it holds."""
    from torchlens.analysis.ranks.verdict import folder_status
    from torchlens.capture.ranks.feed import FRAME_FORMAT, VERSION, LiveFrame
    from torchlens.formats.run_folder.manifest import read_manifest
    from torchlens.formats.run_folder.records import read_steps, read_summaries
    from torchlens.frontends.ranks.folder_summaries import fill_from_traces
    from torchlens.model.records import summaries_from

    manifest = read_manifest(run_dir)
    world = manifest.world_size
    steps = [read_steps(run_dir, r) for r in range(world)]
    summaries = [read_summaries(run_dir, r) for r in range(world)]
    unread = fill_from_traces(run_dir, manifest, summaries)  # a %ddp_check folder's
    status = folder_status(manifest, steps, [summaries_from(s)[0] for s in summaries])
    if unread:
        status.notes = [*status.notes, f"traces not drawn: {'; '.join(unread)}"]
    t = manifest.created or time.time()
    status.run_id, status.t, status.ended = manifest.run_id, t, True
    ended: dict[str, tuple[str, float]] = {}
    for row in status.ranks:
        entry = manifest.rank(row.rank)
        ended[str(row.rank)] = (row.ended or row.state or "ended",
                                (entry.last_heartbeat if entry else None) or t)
    # a frame as the live feed writes one
    return LiveFrame(
        format=FRAME_FORMAT, version=VERSION, seq=0, t=t,
        # the run's start, as its own view drew it (%ddp_check: its launch)
        t0=manifest.started or min((s[0].t0 for s in steps if s), default=t),
        run_id=manifest.run_id, world_size=world, ended=True, status=status.to_json(),
        steps={str(r): s for r, s in enumerate(steps) if s},
        summaries={str(r): s for r, s in enumerate(summaries) if s},
        ended_ranks=ended,
        heartbeats={str(r): _beats(s) for r, s in enumerate(steps) if s})


def _beats(records: list[StepRecord]) -> list[FrameBeat]:
    """A finished rank's RSS over time, from its step records (a feed sends
    heartbeats; a folder keeps none)."""
    from torchlens.capture.ranks.feed import FrameBeat

    every = max(1, len(records) // FOLDER_BEATS)
    return [FrameBeat(t=rec.t1, rss=rec.mem.rss if rec.mem else None, phase="step")
            for rec in records[::every]]


# -- the handle ------------------------------------------------------------------------
