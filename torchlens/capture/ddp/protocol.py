"""What the kernel and the workers say to each other through the TCPStore.

One place for the key names and the JSON encoding, so the launcher (in the
notebook kernel) and the workers (spawned interpreters) cannot drift apart.
Values are JSON, never pickles, except the payload the kernel itself wrote:
the parent only ever decodes data, so a broken worker cannot run code in the
kernel.
"""

from __future__ import annotations

import json
from typing import Any

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


# One encoder for every call: json.dumps with a ``default`` builds a new
# JSONEncoder each time, a third of encoding a fingerprint (once per collective).
_ENCODER = json.JSONEncoder(default=str, allow_nan=True)


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
    """Counter: slots taken so far (each attaching process adds 1)."""
    return f"{run_prefix(run_id)}/slots"


def slot_key(run_id: str, slot: int, what: str) -> str:
    """``hello``, ``hb`` (its last one carries the ``bye``), ``steps/n``, ``steps/<i>``,
    ``prof/n``, ``prof/<i>``."""
    return f"{run_prefix(run_id)}/s/{slot}/{what}"


def run_every_key(run_id: str, restart: int, rank: int) -> str:
    """The profiling interval ``rank`` proposes (one agreement per restart of the world)."""
    return f"{run_prefix(run_id)}/every/{restart}/{rank}"
