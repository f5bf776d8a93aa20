"""Start and stop a real JupyterLab for browser tests and benchmarks.

Every run gets its own port, token, runtime/workspace/settings dirs, so no
saved layout, news popup or other server gets in the way; the server and the
browser are stopped by their own PIDs / handles at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Lab:
    url: str  # ends with "/", includes base_url
    token: str
    proc: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(tmp: Path, base_url: str = "/", extra: list[str] | None = None) -> Lab:
    """Start JupyterLab with isolated dirs; return once its API answers."""
    port, token = _free_port(), secrets.token_hex(16)
    settings = tmp / "app_settings"
    settings.mkdir(parents=True)
    (settings / "overrides.json").write_text(
        json.dumps(
            {
                "@jupyterlab/apputils-extension:notification": {
                    "fetchNews": "false",
                    "checkForUpdates": False,
                }
            }
        )
    )
    (tmp / "root").mkdir()
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
    }
    # the sidebar's "torchrun jobs" from a registry of this lab's own, unless the
    # test made one: the user's ~/.cache/torchlens/runs may list any job running
    # on the machine (another test's, a helper's), which moved the charts below it
    env.setdefault("TORCHLENS_RUNS_DIR", str(tmp / "runs"))
    # Serve the sidebar built in this checkout (torchlens/labextension), not
    # whichever copy `pip install` left in the environment: JUPYTER_PATH comes
    # first when JupyterLab looks for labextensions.
    import torchlens

    built = Path(torchlens.__file__).resolve().parent / "labextension"
    if (built / "package.json").exists():
        (tmp / "jupyter_path" / "labextensions").mkdir(parents=True)
        (tmp / "jupyter_path" / "labextensions" / "torchlens").symlink_to(built)
        env["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (str(tmp / "jupyter_path"), os.environ.get("JUPYTER_PATH", "")) if p)
    log = tmp / "lab.log"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={tmp / 'root'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp / 'user_settings'}",
        f"--LabApp.app_settings_dir={settings}",
        *(extra or []),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    lab = Lab(f"http://127.0.0.1:{port}{base_url}", token, proc, log)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {log.read_text()[-2000:]}")
        try:
            request = urllib.request.Request(
                lab.url + "api/status", headers={"Authorization": f"token {token}"}
            )
            with urllib.request.urlopen(request, timeout=2):
                return lab
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    stop_lab(lab)
    raise RuntimeError("jupyter lab did not start in 90 s")


def stop_lab(lab: Lab) -> None:
    """Stop the server by its own PID (SIGINT twice is Jupyter's clean shutdown)."""
    if lab.proc.poll() is None:
        lab.proc.send_signal(signal.SIGTERM)
        try:
            lab.proc.wait(15)
        except subprocess.TimeoutExpired:
            lab.proc.kill()
            lab.proc.wait(5)
