"""What the kernel and the workers say to each other through the TCPStore.

One place for the key names and the JSON encoding, so the launcher (in the
notebook kernel) and the workers (spawned interpreters) cannot drift apart.
Values are JSON, never pickles, except the payload the kernel itself wrote:
the parent only ever decodes data, so a broken worker cannot run code in the
kernel. Every value goes through a ``Channel``: sealed with the run's key
(``signing``) when set, opened before it is decoded (docs/SECURITY.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from torchlens.capture.channel.signing import Forged, RunKey

#: Keys live under this prefix; the process group gets its own PrefixStore.
PREFIX = "tl"
PG_PREFIX = "pg"

PAYLOAD = "payload"  # cloudpickle of the Job, written once by the kernel


def heartbeat_key(rank: int) -> str:
    """Latest heartbeat of ``rank`` (overwritten several times a second)."""
    return f"hb/{rank}"


def fingerprint_key(rank: int, index: int) -> str:
    """Fingerprint of ``rank``'s collective number ``index``, set before it runs."""
    return f"fp/{rank}/{index}"


def result_key(rank: int) -> str:
    """``rank``'s final record, set once when its work ends (or fails)."""
    return f"result/{rank}"


def done_key() -> str:
    """Counter each rank bumps (``store.add``) right after setting its result.

    One ``add(key, 0)`` tells the kernel whether any rank has finished, instead
    of one ``check`` per rank on every poll.
    """
    return "done"


def stop_key() -> str:
    """Set by a rank that failed a --strict check, so peers stop waiting."""
    return "stop"


def _builtin(value: Any) -> Any:
    """Step records (``model.records``, msgspec structs) as the dicts they encode
    to, key for key; anything else unknown as its text."""
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else str(value)


# One encoder for every call: json.dumps with a ``default`` builds a new
# JSONEncoder each time, a third of encoding a fingerprint (once per collective).
_ENCODER = json.JSONEncoder(default=_builtin, allow_nan=True)


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def decode(data: bytes) -> Any:
    return json.loads(data.decode("utf-8", "replace"))



# --profile (docs/RANK_PROFILE.md): batches of step records and profiled-step
# summaries, each under its own numbered key with a counter beside it, so
# nothing is overwritten before the kernel has read it; the kernel deletes
# what it has read.
def steps_key(rank: int, index: int) -> str:
    return f"steps/{rank}/{index}"


def steps_count_key(rank: int) -> str:
    return f"steps/{rank}/n"


def summary_key(rank: int, index: int) -> str:
    return f"prof/{rank}/{index}"


def summary_count_key(rank: int) -> str:
    return f"prof/{rank}/n"


def every_key(rank: int) -> str:
    """The profiling interval ``rank`` proposes after its first profiled step."""
    return f"every/{rank}"


# ``torchlens run`` (docs/MULTINODE.md): ranks of a torchrun job report to the
# collector's TCPStore. Every key sits under the run id, so ranks of another
# run (or job) on the same port never touch this run's keys. Each attaching
# process takes a *slot* (``store.add(slots)``): a restarted rank gets a new
# slot, so its numbered keys never collide with its earlier incarnation's.
def run_prefix(run_id: str) -> str:
    return f"tlrun/{run_id}"


def slots_key(run_id: str) -> str:
    """Counter: slots taken so far (each attaching process adds 1).

    Unsigned (a ``store.add`` cannot be sealed), so it only hands out distinct
    numbers: the collector never reads it. Anyone who can reach the port can
    move it on; the ranks then take higher numbers, nothing else changes. Which
    slots exist the collector learns from the signed rosters (``roster_key``).
    """
    return f"{run_prefix(run_id)}/slots"


#: a rank's roster keeps its newest slots, this many (a rank restarted more
#: often than that loses its oldest starts from the roster, not the collector's
#: memory of those it already read)
ROSTER_SLOTS = 64
#: the largest world the collector looks for rosters of (a hello saying more is
#: read as this many)
MAX_WORLD = 1 << 16


def roster_key(run_id: str, rank: int) -> str:
    """Rank ``rank``'s roster: a sealed ``{"slots": [...]}``, the slots its
    processes took, newest last. The collector looks here (ranks 0 to the
    world size its ranks' hellos say) to find slots; every value is signed,
    so nobody without the secret can make it look anywhere else."""
    return f"{run_prefix(run_id)}/rank/{rank}"


def roster_slots(chan: Channel, name: str, data: bytes) -> list[int] | None:
    """The slots of a roster value; None (counted by ``chan``) when it is forged
    or not a roster."""
    value = chan.open(name, data) if data else None
    if not isinstance(value, dict):
        return None
    slots = value.get("slots")
    if not isinstance(slots, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in slots):
        return None
    return slots[-ROSTER_SLOTS:]


def enroll(chan: Channel, run_id: str, rank: int, slot: int, tries: int = 50) -> bool:
    """Add ``slot`` to ``rank``'s roster (a ``compare_set``, so two processes of
    one rank never lose each other's slot). A roster someone forged is
    replaced. False when it could not in ``tries`` attempts (someone rewrites
    the key as fast as it is set)."""
    name = roster_key(run_id, rank)
    store = chan.store
    for _ in range(tries):
        current = bytes(store.get(name)) if store.check([name]) else b""
        slots = (roster_slots(chan, name, current) or []) if current else []
        if slot in slots:
            return True
        desired = chan.seal(name, {"slots": [*slots, slot][-ROSTER_SLOTS:]})
        if bytes(store.compare_set(name, current, desired)) == desired:
            return True
    return False


def slot_key(run_id: str, slot: int, what: str) -> str:
    """``hello``, ``hb`` (its last one carries the ``bye``), and the rings
    ``steps/<j % RING>``, ``prof/<j % RING>`` (``ring_key``)."""
    return f"{run_prefix(run_id)}/s/{slot}/{what}"


# A slot's step batches and summaries live in rings of keys (``steps/<j % RING>``),
# not one key each: the store then holds at most RING values a slot and kind
# however far the collector falls behind, and the collector reads without
# deleting (a delete is a store round trip per value: at 1,024 ranks a tenth
# of a core). How many exist is in the slot's sealed heartbeat (``sent``),
# not in a counter: a counter (``store.add``) cannot be sealed.
RING = {"steps": 32, "prof": 4}
#: the parts of a profiled-step summary the collector decodes and keeps (the
#: live view reads these); the rest (the ops of the step's timeline, ~50 KB)
#: it only verifies and writes to the run folder
SUMMARY_KEYS = ("rank", "step", "trace", "t0", "t1", "step_ms", "breakdown", "memory",
                "events", "bytes", "overlap")


def read_key(run_id: str, slot: int) -> str:
    """Where the collector seals how many step batches of ``slot`` it has read
    (``{"steps": n}``): the rank writes a batch over ring value ``j`` only once
    ``n > j`` (``capture.ranks.attach.StepRing``)."""
    return slot_key(run_id, slot, "read")


#: step batches a rank may leave at exit beyond its ring (its hold, in batches)
LAST_KEYS = 4


def last_key(run_id: str, slot: int, n: int) -> str:
    """Step batch ``n`` of those a rank left at exit that its ring had no room
    for (its goodbye heartbeat counts them: ``Heartbeat.last``)."""
    return slot_key(run_id, slot, f"last/{n}")


def ring_key(run_id: str, slot: int, kind: str, seq: int) -> str:
    """Where value number ``seq`` of ``kind`` (``steps`` or ``prof``) of ``slot`` is set."""
    return slot_key(run_id, slot, f"{kind}/{seq % RING[kind]}")


def pack(seq: int, payload: bytes, head: dict[str, Any] | None = None) -> bytes:
    """A numbered value: one JSON line with its number (and ``head``), then the payload.

    The number says which value a ring key holds now (a rank that ran a ring
    ahead has overwritten the older one); the head is what a reader decodes
    without decoding the payload. JSON has no raw newline outside strings,
    so the first newline ends the head.
    """
    return encode({"seq": seq, **(head or {})}) + b"\n" + payload


def unpack(body: bytes) -> tuple[dict[str, Any], bytes]:
    """(head, payload) of ``pack``; ValueError when ``body`` is not one."""
    line, sep, payload = body.partition(b"\n")
    head = decode(line)
    if not sep or not isinstance(head, dict) or not isinstance(head.get("seq"), int):
        raise ValueError("not a numbered value")
    return head, payload


def pack_summary(seq: int, summary: dict[str, Any]) -> bytes:
    """A profiled-step summary as a numbered value: SUMMARY_KEYS in the head."""
    head = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    rest = {k: v for k, v in summary.items() if k not in head}
    return pack(seq, encode(rest), head)


def merge_summary(head: dict[str, Any], payload: bytes) -> bytes:
    """The whole summary as one JSON object (the run folder's line), without decoding the rest.

    Two JSON objects with disjoint keys join into one by their text.
    """
    first = encode({k: v for k, v in head.items() if k != "seq"})
    rest = payload.strip()
    if not (rest.startswith(b"{") and rest.endswith(b"}")) or rest == b"{}":
        return first
    if first == b"{}":
        return rest
    return first[:-1] + b"," + rest[1:]


def run_every_key(run_id: str, round_: str, rank: int) -> str:
    """The profiling interval ``rank`` proposes in rendezvous round ``round_``
    (``attach.rendezvous_round``: one agreement per start of the world)."""
    return f"{run_prefix(run_id)}/every/{round_}/{rank}"


# The live feed (``capture.ranks.feed``): the collector publishes a frame about
# once a second under ``live/<seq>`` and the newest seq under ``live/n`` (a
# sealed value, not a counter: a watcher must not be sent after frames that
# are not there); ``torchlens.watch`` reads them as a store client.
def live_key(run_id: str, seq: int) -> str:
    """Frame ``seq`` of the live feed (the collector keeps the newest few)."""
    return f"{run_prefix(run_id)}/live/{seq}"


def live_count_key(run_id: str) -> str:
    """The newest frame's seq (sealed JSON int)."""
    return f"{run_prefix(run_id)}/live/n"


def live_watchers_key(run_id: str) -> str:
    """Counter: watchers that joined (each adds 1)."""
    return f"{run_prefix(run_id)}/live/watchers"


def live_done_key(run_id: str) -> str:
    """Counter: watchers that read the last frame or left (each adds 1 once)."""
    return f"{run_prefix(run_id)}/live/done"


def live_announce_key() -> str:
    """Which run this collector hosts: its run id, sealed with the run's key.

    Outside any run prefix, so that a watcher given only the secret (the
    ``run.secret`` file) learns the run id; it trusts it only once the seal
    opens under that id and the secret.
    """
    return "tlrun/live"


#: The key kinds a drop is counted under (the first part of the key name).
KINDS = {"hb": "heartbeat", "fp": "fingerprint", "result": "result", "steps": "step batch",
         "prof": "profiled-step summary", "every": "profiling interval",
         "stop": "stop", PAYLOAD: "payload"}


def kind_of(name: str) -> str:
    """The drop-count kind of key ``name`` (``result/3`` -> ``result``)."""
    head = name.split("/", 1)[0]
    return KINDS.get(head, head)


class Channel:
    """The run's store as the ranks and the kernel use it: every value signed.

    ``set`` seals a value with the run key under its own key name; ``get``,
    ``multi_get`` and ``check`` open what they read and hand back ``None`` for
    a value that fails (written by someone without this run's secret: a
    leftover rank of an earlier run on a reused port, or anyone who can reach
    the port). Such a value is counted in ``dropped`` (per key kind, each
    distinct forged value once, however often it is re-read) and never
    decoded, so it can cost the reader that value but never the run. One
    class for this so that no call site can forget to seal or to open.

    Counters bumped with ``store.add`` (``done``, ``steps/R/n``, ``prof/R/n``)
    cannot be sealed: the store adds to them itself. That is safe because a
    count only ever makes a reader look for a key: a forged count at worst
    makes it look for a key that is absent (readers take only keys that exist,
    ``existing``) or one whose value then fails ``open``.
    """

    def __init__(self, store: Any, key: RunKey) -> None:
        self.store, self.key = store, key
        self.dropped: dict[str, int] = {}
        self._forged: dict[str, bytes] = {}  # the last refused value per key

    # -- sealed JSON values --------------------------------------------------
    def seal(self, name: str, value: Any) -> bytes:
        return self.key.seal(name, encode(value))

    def set(self, name: str, value: Any) -> None:
        self.store.set(name, self.seal(name, value))

    def open_body(self, name: str, data: bytes) -> bytes | None:
        """The body of a value sealed for ``name``, or ``None`` (counted) when it
        fails its signature: for a reader that keeps the JSON as received."""
        data = bytes(data)
        try:
            return self.key.open(name, data)
        except Forged:
            if self._forged.get(name) != data:
                self._forged[name] = data
                kind = kind_of(name)
                self.dropped[kind] = self.dropped.get(kind, 0) + 1
            return None

    def open(self, name: str, data: bytes) -> Any:
        """The decoded value, or ``None`` (counted) when it fails its signature."""
        body = self.open_body(name, data)
        return None if body is None else decode(body)

    def get(self, name: str) -> Any:
        """The value of ``name`` (waits until it is set, as ``store.get`` does)."""
        return self.open(name, self.store.get(name))

    def multi_get(self, names: Sequence[str]) -> list[Any]:
        """Values of keys that exist (``multi_get`` waits on a missing one)."""
        if not names:
            return []
        return [self.open(n, v) for n, v in zip(names, self.store.multi_get(list(names)),
                                                 strict=True)]

    def check(self, name: str) -> bool:
        """``name`` holds a genuine value: a forged one does not count as set."""
        return bool(self.store.check([name])) and self.get(name) is not None

    def existing(self, names: Sequence[str]) -> list[str]:
        """The longest prefix of ``names`` whose keys exist.

        One ``check`` in the usual case (all exist); key by key only when a
        count ran ahead of its keys, which only a forged ``add`` does.
        """
        if not names or self.store.check(list(names)):
            return list(names)
        out = []
        for name in names:
            if not self.store.check([name]):
                break
            out.append(name)
        return out

    # -- the payload (bytes, and refused loudly rather than dropped) ---------
    def set_bytes(self, name: str, body: bytes) -> None:
        self.store.set(name, self.key.seal(name, body))

    def get_bytes(self, name: str) -> bytes:
        """The body of ``name``; raises ``Forged`` when it is unsigned or forged."""
        return self.key.open(name, bytes(self.store.get(name)))

    # -- unsigned by necessity -------------------------------------------------
    def add(self, name: str, amount: int) -> int:
        """A counter (unsigned: see the class docstring for why that is safe)."""
        return int(self.store.add(name, amount))

    def delete(self, name: str) -> None:
        self.store.delete_key(name)
