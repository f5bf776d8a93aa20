"""Running ``torchlens run`` and torchrun for real in tests (CPU, gloo)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "ranks" / "train_script.py"
BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PATH=f"{BIN}:{out.get('PATH', '')}",
               TORCH_CPP_LOG_LEVEL="ERROR")
    out.update(extra)
    return out


def torchrun_args(nnodes: int, nproc: int, port: int, script: Path = SCRIPT) -> list[str]:
    return [TORCHRUN, "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"job{port}", str(script)]


def report(out: Path, tmp_path: Path, timeout: float = 180) -> tuple[str, str]:
    """``torchlens report OUT -o tmp_path/report.html``, as a user runs it: what it
    printed and the page it wrote (it must exit 0)."""
    html = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "torchlens", "report", str(out), "-o", str(html)],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout, html.read_text(encoding="utf-8")


class Collector:
    """``python -m torchlens run`` in its own session; its output gathered line by line."""

    def __init__(self, out: Path, command: list[str], run_options: tuple[str, ...] = (),
                 **extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchlens", "run", "--out", str(out), *run_options, "--",
             *command],
            cwd=REPO, env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, prefix: str, timeout: float = 60, anywhere: bool = False) -> str:
        """The first line that starts with ``prefix`` (``anywhere``: holds it: two
        ranks' prints to one pipe can share a line, "rank 0 step 25rank 1 step 25",
        as under bare torchrun)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if (prefix in line) if anywhere else line.strip().startswith(prefix):
                    return line.strip()
            time.sleep(0.1)
        raise AssertionError(f"no line starting {prefix!r} in:\n{self.output}")

    def wait(self, timeout: float = 240) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=10)


def other_node_env(line: str) -> tuple[dict[str, str], list[str]]:
    """The printed command for other nodes: its VAR=value words, then the command."""
    words = shlex.split(line)
    extra = {}
    while words and "=" in words[0] and words[0].split("=")[0].isupper():
        name, value = words.pop(0).split("=", 1)
        if name == "PYTHONPATH":  # a shell expansion: what bash makes of it on that node
            value = subprocess.run(["bash", "-c", f'echo "{value}"'], capture_output=True,
                                   text=True, env={**os.environ, "PATH": os.path.dirname(
                                       sys.executable) + os.pathsep + os.environ["PATH"]},
                                   check=True).stdout.strip()
        extra[name] = value
    return extra, words


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Live processes whose environment names this run (ranks and agents)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TORCHLENS_RUN_ID") == run_id and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def cmdlines() -> list[bytes]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                continue
    return out
