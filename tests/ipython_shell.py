"""The IPython shell a magic test types its cells into."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from IPython.core.interactiveshell import InteractiveShell


@contextmanager
def torchlens_shell(*setup: str) -> Iterator[InteractiveShell]:
    """A fresh shell with torchlens' magics loaded and each ``setup`` cell run;
    cleared on exit, so the next module starts from a fresh one."""
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        assert ip.run_cell("%load_ext torchlens").success
        for cell in setup:
            res = ip.run_cell(cell)
            assert res.success, res.error_in_exec
        yield ip
    finally:
        InteractiveShell.clear_instance()
