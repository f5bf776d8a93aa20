"""Signed messages between the ranks and whoever collects them.

The store (or collector) port can be reached by anyone on the network path,
and on a shared machine by any local user. So every value a rank or the
launcher writes is sealed with an HMAC-SHA256 under a per-run secret, and
every value read is checked before it is decoded; the cloudpickle payload is
checked before it is unpickled, so a forged payload never runs.

The MAC covers the run id, the key name and the body: a message cannot be
replayed under another key (rank 1's result as rank 2's), and a message of
an earlier run, or of another job using the same port, fails (other secret,
other run id) instead of being mixed in.

The secret travels to the ranks in the environment (``TORCHLENS_RUN_SECRET``,
hex) or a 0600 file named by ``TORCHLENS_RUN_SECRET_FILE``; never in argv,
which every local user can read in ``/proc/*/cmdline``, and never in logs
(``RunKey``'s repr hides it).
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass, field

ENV_SECRET = "TORCHLENS_RUN_SECRET"
ENV_SECRET_FILE = "TORCHLENS_RUN_SECRET_FILE"
ENV_RUN_ID = "TORCHLENS_RUN_ID"
MAC_BYTES = 32
#: Leads every sealed value, so an unsealed one is told apart from a bad MAC.
MAGIC = b"tl1"


class Forged(ValueError):
    """A value whose MAC does not match: written by someone without the secret."""


@dataclass(frozen=True)
class RunKey:
    """A run's id (public, printed) and its secret (never shown)."""

    run_id: str
    secret: bytes = field(repr=False)

    @classmethod
    def new(cls) -> RunKey:
        return cls(secrets.token_hex(8), secrets.token_bytes(32))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RunKey | None:
        """The run's key from the environment, ``None`` when none is set.

        Raises ``ValueError`` (saying what to fix) for a secret file that other
        users can read or a secret that is not hex.
        """
        env = os.environ if env is None else env
        run_id = env.get(ENV_RUN_ID)
        path = env.get(ENV_SECRET_FILE)
        text = env.get(ENV_SECRET)
        if path:
            mode = os.stat(path).st_mode & 0o077
            if mode:
                raise ValueError(f"{ENV_SECRET_FILE}={path} is readable by other users "
                                 f"(mode {oct(os.stat(path).st_mode & 0o777)}): "
                                 f"chmod 600 {path}")
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        if not text or not run_id:
            return None
        try:
            return cls(run_id, bytes.fromhex(text))
        except ValueError:
            raise ValueError(f"the run secret in {ENV_SECRET_FILE if path else ENV_SECRET} "
                             "is not hex: pass the value torchlens printed or wrote") from None

    def env(self) -> dict[str, str]:
        """What a child process needs (to be merged into its environment)."""
        return {ENV_RUN_ID: self.run_id, ENV_SECRET: self.secret.hex()}

    def write_secret(self, path: str) -> str:
        """Write the secret to a new 0600 file (for other nodes); returns ``path``."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(self.secret.hex())
        return path

    def _mac(self, name: str, body: bytes) -> bytes:
        # hmac.digest is OpenSSL's one-shot HMAC: about 2 us for a heartbeat,
        # where hmac.new + update costs 5 us (benchmarks/bench_signing.py). The
        # NUL separators keep (run id, name, body) unambiguous: neither the hex
        # run id nor a key name contains one.
        head = b"%s\0%s\0" % (self.run_id.encode(), name.encode())
        return hmac.digest(self.secret, head + body, "sha256")

    def seal(self, name: str, body: bytes) -> bytes:
        """``body`` with its MAC for key ``name``."""
        return MAGIC + self._mac(name, body) + body

    def open(self, name: str, data: bytes) -> bytes:
        """The body of a value sealed for ``name``; ``Forged`` when it was not."""
        data = bytes(data)
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + MAC_BYTES:
            raise Forged(f"{name}: not signed")
        mac = data[len(MAGIC):len(MAGIC) + MAC_BYTES]
        body = data[len(MAGIC) + MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(name, body)):
            raise Forged(f"{name}: bad signature (another run, or forged)")
        return body
