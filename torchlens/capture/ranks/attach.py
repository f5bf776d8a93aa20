"""The rank side of ``torchlens run``: an unchanged torchrun script reports to the collector.

``torchlens.step()`` checks the environment once; when ``TORCHLENS_COLLECTOR``
(``host:port``) is set, its first call attaches this process: it connects a
TCPStore client to the collector, takes a *slot* (a number of its own, so a
restarted rank never overwrites what its earlier incarnation sent), says
hello, adds the slot to its rank's signed roster (where the collector finds it) (rank, world size, node, host, pid, restart count), and starts the
``--profile`` capture of ``%ddp_check`` (``stepper.RankProfiler``: step
records with phase times and memory, profiled steps summarised by the rank
itself). A daemon thread sends a heartbeat, the new step records and the new
summaries twice a second; at exit the last of them and a ``bye``.

Step records are never written over a value the collector has not read
(``StepRing``): a rank whose collector falls behind holds its records and
sends them in fewer, larger batches once the collector has caught up, so a
slow or starved collector costs latency, not records. At exit what it still
holds goes to the slot's ``last`` keys, read after its goodbye: the rank
never waits for the collector.

Everything sent is JSON sealed with the run's key (``signing.RunKey``) under
its own key name, so the collector drops what anyone else wrote; the rank
reads back only sealed JSON (the agreed profiling interval), never a pickle.

Why the rank ends itself when its elastic agent dies: torchrun starts each
worker in a session of its own, so killing an agent (or its node's process
group) leaves the workers running with nobody to stop or restart them. A
rank whose parent changed says so in its ``bye`` (the collector then knows
the node was lost, not merely slow) and kills itself.

Step 0 is the step after the first ``torchlens.step()``: the steps before it
ran before the capture existed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.model.messages import Bye, Heartbeat, Hello, OomOutcome

ENV_COLLECTOR = "TORCHLENS_COLLECTOR"
#: where ranks export their profiled steps' traces (the run folder, when this
#: node can write it: the collector's own node, or a shared file system)
ENV_RUN_DIR = "TORCHLENS_RUN_DIR"
#: "0": the rank records its steps but never runs torch.profiler (``--no-profile``)
ENV_PROFILE = "TORCHLENS_PROFILE_STEPS"
HEARTBEAT_S = 0.5
#: how long a rank tries to reach its collector before it trains on without it
#: (the collector listens before the job starts: a longer wait is a dead one)
CONNECT_TIMEOUT_S = 10.0
#: a store call's timeout once connected
STORE_TIMEOUT_S = 30.0
FINISH_WAIT_S = 10.0
#: how long a rank's exit waits for its sender thread to leave a store call
SENDER_JOIN_S = 5.0
#: how often a rank checks that its roster (``protocol.roster_key``) still names its slot
ROSTER_CHECK_S = 5.0
#: step records a rank holds while its ring is full of values the collector
#: has not read (400 s of steps at 20 a second, ~1 KB each); past it the
#: oldest are shed and counted (``Heartbeat.shed``)
HOLD_RECORDS = 8192
#: step records in one batch at most (a ring value is refused over 4 MiB)
BATCH_RECORDS = 2048

_attached: Attachment | None = None
#: why this process could not attach, once it tried: it never tries again
_failed: str | None = None


def _int_env(name: str, default: int | None = None) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) -> (host, port); ValueError when not."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{ENV_COLLECTOR}={text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def rendezvous_round(env: Mapping[str, str]) -> str:
    """A name that every worker of one rendezvous round shares and the next
    round does not: where the ranks agree on their profiling interval.

    The agents' ``TORCHELASTIC_RESTART_COUNT`` is not one: an agent counts
    only its own node's failures, so after node A's worker fails, A's new
    workers say 1 and node B's (restarted because A came back to the
    rendezvous) still say 0. With a fresh store per round (the agent's store
    not shared: ``torchlens run``'s default) the round's store address is
    new each round and the same on every node. With the agent's store shared
    across rounds the address never changes, and the restart count, what
    torch itself keys that store with, is all there is."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return f"restart{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"


def _run_dir(requested: str | None, rank: int) -> tuple[str, bool]:
    """(where this rank writes its traces, whether that is the shared run folder)."""
    if requested:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(requested, f"rank{rank}"), exist_ok=True)
        if os.access(os.path.join(requested, f"rank{rank}"), os.W_OK):
            return requested, True
    return tempfile.mkdtemp(prefix=f"torchlens-rank{rank}-"), False


class StepRing:
    """A rank's step batches in its ring of store keys (``protocol.ring_key``),
    never written over a value the collector has not read.

    The collector seals how many batches of this slot it has read under the
    slot's ``read`` key (``protocol.read_key``). While the ring holds fewer than
    ``protocol.RING`` unread values a batch goes out at once; when the next one
    would land on an unread value, the ring asks the store how far the
    collector has read (one ``get``, only then) and, if it is still behind,
    holds the records and sends them with the next batch that fits. A held
    list past ``hold`` records sheds its oldest, counted in ``shed``.

    Profiled-step summaries (``summary_room``) follow the same word: one made
    while the summaries' ring is full of unread ones is not sent, counted in
    ``skipped`` (its trace file is written all the same).
    """

    def __init__(self, chan: protocol.Channel, run_id: str, slot: int,
                 hold: int = HOLD_RECORDS, batch: int = BATCH_RECORDS) -> None:
        self.chan, self.run_id, self.slot = chan, run_id, slot
        self.hold, self.batch = hold, batch
        self.sent = 0  # batches set
        self.read = 0  # batches the collector said it read (its newest word)
        self.held: list[Any] = []
        self.shed = 0
        self.summaries_read = 0  # summaries the collector said it read
        self.skipped = 0  # summaries not sent: their ring was full of unread ones

    def _ask(self, sent_summaries: int) -> None:
        """How far the collector has read, from the slot's ``read`` key."""
        name = protocol.read_key(self.run_id, self.slot)
        if not self.chan.store.check([name]):
            return
        value = self.chan.open(name, bytes(self.chan.store.get(name)))
        if not isinstance(value, dict):
            return
        # an older genuine word set again moves nothing back
        n, m = value.get("steps"), value.get("prof")
        if isinstance(n, int) and not isinstance(n, bool):
            self.read = max(self.read, min(n, self.sent))
        if isinstance(m, int) and not isinstance(m, bool):
            self.summaries_read = max(self.summaries_read, min(m, sent_summaries))

    def room(self) -> bool:
        """Whether the next batch lands on a ring key whose value was read."""
        ring = protocol.RING["steps"]
        if self.sent - self.read < ring:
            return True
        self._ask(self.summaries_read)
        return self.sent - self.read < ring

    def summary_room(self, sent: int) -> bool:
        """Whether summary number ``sent`` lands on a ring key whose value was
        read; False counts it as ``skipped``."""
        ring = protocol.RING["prof"]
        if sent - self.summaries_read >= ring:
            self._ask(sent)
        if sent - self.summaries_read < ring:
            return True
        self.skipped += 1
        return False

    def put(self, records: list[Any]) -> None:
        self.held += records
        over = len(self.held) - self.hold
        if over > 0:
            del self.held[:over]
            self.shed += over

    def send(self) -> None:
        """The held records, in batches, while the ring has room."""
        while self.held and self.room():
            batch = self.held[:self.batch]
            name = protocol.ring_key(self.run_id, self.slot, "steps", self.sent)
            self.chan.set_bytes(name, protocol.pack(self.sent, protocol.encode(batch)))
            del self.held[:len(batch)]
            self.sent += 1

    def send_last(self) -> int:
        """At exit: what the ring has no room for, into the slot's ``last`` keys
        (``protocol.last_key``, read once its goodbye is); how many were set."""
        self.send()
        n = 0
        while self.held and n < protocol.LAST_KEYS:
            batch = self.held[:self.batch]
            name = protocol.last_key(self.run_id, self.slot, n)
            self.chan.set_bytes(name, protocol.pack(n, protocol.encode(batch)))
            del self.held[:len(batch)]
            n += 1
        self.shed += len(self.held)  # past LAST_KEYS batches: more than the hold allows
        self.held.clear()
        return n


class Attachment:
    """One attached process: its store client, slot, profiler and sender thread."""

    def __init__(self, key: RunKey, host: str, port: int,
                 summarize: Callable[..., dict[str, Any]] | None = None) -> None:
        import torch.distributed as dist

        from torchlens.capture.ranks.fsdp_memory import FsdpMemory
        from torchlens.capture.ranks.stepper import RankProfiler

        self.key = key
        self.rank = _int_env("RANK", 0) or 0
        self.world_size = _int_env("WORLD_SIZE", 1) or 1
        self.local_rank = _int_env("LOCAL_RANK", 0) or 0
        self.restart = _int_env("TORCHELASTIC_RESTART_COUNT", 0) or 0
        # a plain connect first: a collector that is gone is then one line here,
        # not torch's timeouts with their C++ stacks logged on stderr
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise ConnectionError(f"cannot reach {host}:{port} "
                                  f"({exc.strerror or type(exc).__name__}): torchlens run "
                                  "has ended or is unreachable; training goes on") from None
        self.store = dist.TCPStore(host, port, is_master=False,
                                   timeout=timedelta(seconds=CONNECT_TIMEOUT_S))
        self.store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        self.chan = protocol.Channel(self.store, key)
        self.slot = int(self.store.add(protocol.slots_key(key.run_id), 1)) - 1
        self.run_dir, self.shared = _run_dir(os.environ.get(ENV_RUN_DIR), self.rank)
        # the device is the script's own, read when it has run a step (not
        # cuda:LOCAL_RANK: with per-rank CUDA_VISIBLE_DEVICES that is no GPU)
        self.profiler = RankProfiler(rank=self.rank, run_dir=self.run_dir, device=None,
                                     every=None, summarize=summarize, agree=self._agree,
                                     fsdp=FsdpMemory(fsdp_only=True))
        self.profiler.profiling = os.environ.get(ENV_PROFILE) != "0"
        self.parent = os.getppid()
        self.under_agent = "TORCHELASTIC_RUN_ID" in os.environ
        self._lock = threading.RLock()  # the SIGTERM handler may run inside a flush
        self._ring = StepRing(self.chan, key.run_id, self.slot)
        self._sent = [0, 0]  # step batches (the ring's count), summaries
        self._last = 0  # step batches set in the ``last`` keys at exit
        self._beat = 0
        self._enrolled = time.monotonic()
        self._closed = False
        self._wake = threading.Event()  # ends the sender's wait at close
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._error_t: float | None = None  # when it was raised: which rank failed first
        self._oom: OomOutcome | None = None

    def _key(self, what: str) -> str:
        return protocol.slot_key(self.key.run_id, self.slot, what)

    def _put(self, name: str, body: Any) -> None:
        self.chan.set(name, body)

    def start(self) -> None:
        # the heartbeat exists before the hello: the collector reads it with
        # multi_get (which would wait on a missing key) once it has the hello
        self._put(self._key("hb"), self._heartbeat())
        self._put(self._key("hello"), msgspec.to_builtins(Hello(
            rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
            # torchrun's agent sets GROUP_RANK; Lightning's own launcher NODE_RANK, or
            # nothing on one machine (node 0, as Lightning reads it)
            node=_int_env("GROUP_RANK", _int_env("NODE_RANK", 0)),
            host=socket.gethostname(), pid=os.getpid(),
            restart=self.restart, elastic_run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
            slot=self.slot, t=time.time(), device=str(self.profiler.settle_device()),
            run_dir=self.run_dir, shared_run_dir=self.shared)))
        # the roster last: the collector finds this slot there, then reads its hello
        protocol.enroll(self.chan, self.key.run_id, self.rank, self.slot)
        self._enrolled = time.monotonic()
        self.profiler.start()
        self._hook_exit()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tl-collector")
        self._thread.start()

    def _heartbeat(self, bye: Bye | None = None) -> Heartbeat:
        from torchlens.capture.ranks.stepper import rss_bytes

        self._beat += 1
        progress = self.profiler.status()
        # "sent" tells the collector which ring keys hold new values
        return Heartbeat(t=time.time(), beat=self._beat, rss=rss_bytes(),
                         sent=[self._ring.sent, self._sent[1]],
                         steps_done=progress.steps_done, phase_calls=progress.phase_calls,
                         steps_by=progress.steps_by, device=progress.device, bye=bye,
                         held=len(self._ring.held), shed=self._ring.shed,
                         skipped=self._ring.skipped or None,
                         last=self._last or None)

    def _set_summary(self, body: bytes) -> None:
        name = protocol.ring_key(self.key.run_id, self.slot, "prof", self._sent[1])
        self.chan.set_bytes(name, body)
        self._sent[1] += 1

    def _flush(self, last: bool = False) -> int:
        """New step records (as the ring has room) and summaries, then the
        heartbeat that counts them. ``last``: the rank is ending; what the ring
        still holds goes to its ``last`` keys; how many (the bye counts them)."""
        with self._lock:
            records, summaries = self.profiler.drain()
            self._ring.put(records)
            self._last = self._ring.send_last() if last else 0
            if not last:
                self._ring.send()
            for summary in summaries:
                if self._ring.summary_room(self._sent[1]):
                    self._set_summary(protocol.pack_summary(self._sent[1], summary))
            self._put(self._key("hb"), self._heartbeat())
            return self._last

    def _loop(self) -> None:
        while not self._closed:
            if self.under_agent and os.getppid() != self.parent:
                self.close("agent died")
                os.kill(os.getpid(), signal.SIGKILL)
            with contextlib.suppress(Exception):  # collector gone: training goes on
                self._flush()
                if time.monotonic() - self._enrolled > ROSTER_CHECK_S:
                    # a roster someone overwrote (or replayed without this slot)
                    # would hide this process from the collector: set it again
                    self._enrolled = time.monotonic()
                    protocol.enroll(self.chan, self.key.run_id, self.rank, self.slot)
            self._wake.wait(HEARTBEAT_S)

    def _agree(self, mine: int) -> int:
        """Every rank's proposed profiling interval; the largest wins (as in ``%ddp_check``)."""
        from torchlens.capture.ranks.stepper import AGREE_WAIT_S

        run_id = self.key.run_id
        round_ = rendezvous_round(os.environ)
        names = [protocol.run_every_key(run_id, round_, r) for r in range(self.world_size)]
        self._put(names[self.rank], mine)
        with contextlib.suppress(Exception):  # a peer gone: take what is there
            self.store.wait(names, timedelta(seconds=AGREE_WAIT_S))
        best = mine
        for name in names:
            if self.store.check([name]):
                with contextlib.suppress(Exception):  # forged: ignored
                    best = max(best, int(self.chan.get(name)))
        return best

    # -- the end -------------------------------------------------------------
    def _hook_exit(self) -> None:
        previous = sys.excepthook

        def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            self._error = f"{kind.__name__}: {str(exc).strip()[:300]}"
            self._error_t = time.time()
            self._oom_snapshot(exc)
            previous(kind, exc, tb)

        sys.excepthook = excepthook
        atexit.register(self.close, "exit")
        # torchrun ends a node's other workers with SIGTERM when one fails; by
        # default that skips atexit, and the collector could not tell "ended by
        # its agent" from "lost". Only where nobody else handles SIGTERM.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            def on_term(signum: int, frame: Any) -> None:
                self.close("SIGTERM")
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_term)

    def _oom_snapshot(self, exc: BaseException) -> None:
        """On a CUDA OOM: the allocator snapshot, or why there is none, in the
        rank's log and the errors its ``bye`` carries."""
        from torchlens.capture.ranks.oom import oom_line, save_oom_snapshot

        try:
            outcome = save_oom_snapshot(exc, self.run_dir, self.rank)
        except Exception as err:  # noqa: BLE001 - the user's exception is what matters
            outcome = OomOutcome(why=f"{type(err).__name__}: {err}")
        if outcome is not None:
            self._oom = outcome
            line = oom_line(self.rank, outcome)
            self.profiler.errors.append(line)
            print(line, file=sys.stderr)

    def close(self, reason: str) -> None:
        """The last records and summaries, then ``bye`` with why this rank ended."""
        if self._closed:
            return
        self._closed = True
        if self.under_agent and os.getppid() != self.parent:
            # its agent is gone, so its node is: the collective error or SIGTERM
            # that ends this rank is the fallout, and the node is what was lost
            reason = "agent died"
        if reason == "exit":
            with contextlib.suppress(Exception):
                self.profiler.finish(wait_s=FINISH_WAIT_S, setup_is_step=False)
        with contextlib.suppress(Exception):
            self._flush(last=True)
            if self._error and reason == "exit":
                reason = "exception"
            # the bye rides on the last heartbeat, which counts the last values
            bye = Bye(t=time.time(), reason=reason, error=self._error, error_t=self._error_t,
                      steps=self.profiler.index, errors=self.profiler.errors[:20],
                      oom=self._oom)
            self._put(self._key("hb"), self._heartbeat(bye))
        self._stop_sender()

    def _stop_sender(self) -> None:
        """Wait for the sender thread to end. A daemon thread inside a store call
        when the interpreter finalizes is ended by ``pthread_exit`` through
        torch's C++ frames, and the process aborts ("terminate called without
        an active exception") after the job's last step."""
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(SENDER_JOIN_S)


def attach(summarize: Callable[..., dict[str, Any]] | None = None) -> Attachment | None:
    """Attach this process to the collector named in the environment (once).

    Returns None, after one line on stderr, when the environment is
    incomplete or the collector cannot be reached: the training goes on
    without torchlens rather than failing.
    """
    global _attached, _failed
    if _attached is not None or _failed is not None:
        return _attached
    try:
        host, port = parse_address(os.environ.get(ENV_COLLECTOR, ""))
        key = RunKey.from_env()
        if key is None:
            raise ValueError("TORCHLENS_RUN_ID and TORCHLENS_RUN_SECRET (or "
                             "TORCHLENS_RUN_SECRET_FILE) are not set: run the command "
                             "`torchlens run` printed for this node")
        attachment = Attachment(key, host, port, summarize)
        attachment.start()
    except Exception as exc:  # noqa: BLE001 - the training must not fail because of us
        # one line: torch's store errors carry a C++ stack after their first
        _failed = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"torchlens: not reporting to the collector: {_failed}", file=sys.stderr)
        return None
    _attached = attachment
    return attachment
