"""Build hook: compile torchlens' C trace scanner when a C compiler is present.

The scanner (torchlens/analysis/kineto_scan.c) is plain C loaded with ctypes,
so it needs no Python headers, only ``cc``. Without a compiler the wheel is
still complete: every trace is then read by the Python path (slower, same
tables), and ``torchlens.analysis._kineto_native.available()`` says so.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "torchlens/analysis/kineto_scan.c"
LIBRARY = "torchlens/analysis/_kineto_scan.so"


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
        cmd = [*shlex.split(cc), "-O3", "-shared", "-fPIC",
               "-o", str(root / LIBRARY), str(root / SOURCE)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            self.app.display_warning(
                f"torchlens: C trace scanner not built ({detail.strip()[:200]}); "
                "traces will be read by the slower Python path")
            return
        build_data["artifacts"].append(LIBRARY)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
