"""``torchlens.watch`` on a folder that does not exist (or not a folder at
all): a notebook shows one clear line, not a traceback through torchlens'
own frames."""

from __future__ import annotations

import pytest

from torchlens.model import InputError


@pytest.mark.parametrize("target, said", [
    ("'/no/such/folder'", "InputError: '/no/such/folder': no such folder, and not host:port; "
     "pass the run folder (`torchlens run --out DIR`) or the address it printed"),
    ("42", "InputError: torchlens.watch takes a run folder or 'host:port', got 42"),
    ("'.', timeout=0", "InputError: timeout must be a number of seconds > 0, got 0"),
])
def test_a_notebook_shows_a_bad_target_as_one_line(capsys, target, said) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    res = shell.run_cell(f"import torchlens\ntorchlens.watch({target})")
    assert isinstance(res.error_in_exec, InputError)
    out = capsys.readouterr()
    shown = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert shown == [said], shown
    assert res.error_in_exec.__cause__ is None and res.error_in_exec.__suppress_context__ \
        or res.error_in_exec.__context__ is None
