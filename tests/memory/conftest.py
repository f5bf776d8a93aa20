"""The IPython shell the %%gpumem magic tests type into."""

from __future__ import annotations

import pytest
from gpumem_fixtures import SETUP
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    assert ip.run_cell("%load_ext torchlens").success
    assert ip.run_cell(SETUP).success
    yield ip
    InteractiveShell.clear_instance()
