"""Build hook: compile torchlens' C trace scanner when a C compiler is present.

The scanner (torchlens/formats/kineto/scan.c) is plain C loaded with ctypes,
so it needs no Python headers, only ``cc``. Its file name carries a hash of
the C source (``scanner_file.library_name``), so the package never loads a
library built from another version of scan.c.

Where it goes: a wheel gets it compiled in a temporary folder and added to the
archive (nothing is written into the source tree); an editable install imports
the package from the source tree, so there it is compiled next to scan.c,
after removing libraries built from older sources.

Without a compiler the wheel is still complete: every trace is then read by
the Python path (slower, same tables), and
``torchlens.formats.kineto.native_available()`` says so.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE_DIR = "torchlens/formats/kineto"


def _scanner_file(root: Path):
    """``scanner_file.py`` loaded by path: it names the library (stdlib only)."""
    spec = importlib.util.spec_from_file_location(
        "_torchlens_scanner_file", root / PACKAGE_DIR / "scanner_file.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        self._tmp = None
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        names = _scanner_file(root)
        source = root / PACKAGE_DIR / "scan.c"
        name = names.library_name(source.read_bytes())
        if version == "editable":
            out_dir = source.parent
            for old in out_dir.glob(names.PATTERN):
                if old.name != name:
                    old.unlink()
        else:
            self._tmp = tempfile.mkdtemp(prefix="torchlens-scan-")
            out_dir = Path(self._tmp)
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
        cmd = [*shlex.split(cc), "-O3", "-shared", "-fPIC",
               "-o", str(out_dir / name), str(source)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            self.app.display_warning(
                f"torchlens: C trace scanner not built ({detail.strip()[:200]}); "
                "traces will be read by the slower Python path")
            return
        if version != "editable":
            build_data["force_include"][str(out_dir / name)] = f"{PACKAGE_DIR}/{name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
