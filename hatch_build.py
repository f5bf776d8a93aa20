"""Build hook: compile torchlens' C readers when a C compiler is present.

Two libraries, each plain C loaded with ctypes (no Python headers, only ``cc``):
the trace scanner (torchlens/formats/kineto/scan.c) and the allocator snapshot
reader (torchlens/formats/snapshot_columns/read.c). Each file name carries a
hash of its C source (``torchlens/formats/native_library.py``, the one module
that names them, loaded here by path), so the package never loads a library
built from another version of the source.

Where it goes: a wheel gets it compiled in a temporary folder and added to the
archive (nothing is written into the source tree); an editable install imports
the package from the source tree, so there it is compiled next to scan.c,
after removing libraries built from older sources.

Without a compiler the wheel is still complete: every trace and snapshot is
then read by the Python path (slower, same tables), and
``torchlens.formats.kineto.native_available()`` /
``formats.snapshot_columns.native.available()`` say so.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: the module that names the libraries (standard library only)
NAMER = "torchlens/formats/native_library.py"


def _libraries(root: Path):
    """``native_library.LIBRARIES``, its module loaded by path (the package's
    dependencies are not installed while it builds)."""
    spec = importlib.util.spec_from_file_location("_torchlens_native_library", root / NAMER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up while it builds
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module.LIBRARIES


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        self._tmp = None
        if self.target_name != "wheel":
            return
        if version != "editable":
            self._tmp = tempfile.mkdtemp(prefix="torchlens-scan-")
        built = [self._compile(version, build_data, lib) for lib in _libraries(Path(self.root))]
        if any(built):
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def _compile(self, version: str, build_data: dict, library) -> bool:
        source = library.source
        package = source.resolve().parent.relative_to(Path(self.root).resolve()).as_posix()
        name = library.library_name(source.read_bytes())
        if version == "editable":
            out_dir = source.parent
            for old in out_dir.glob(library.pattern):
                if old.name != name:
                    old.unlink()
        else:
            out_dir = Path(self._tmp)
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
        cmd = [*shlex.split(cc), "-O3", "-shared", "-fPIC",
               "-o", str(out_dir / name), str(source)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            self.app.display_warning(
                f"torchlens: {source.name} not built ({detail.strip()[:200]}); "
                "files it reads will be read by the slower Python path")
            return False
        if version != "editable":
            build_data["force_include"][str(out_dir / name)] = f"{package}/{name}"
        return True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
