"""The IPython shell the %%gpumem magic tests type into."""

from __future__ import annotations

import pytest
from gpumem_fixtures import SETUP
from ipython_shell import torchlens_shell


@pytest.fixture(scope="module")
def shell():
    with torchlens_shell(SETUP) as ip:
        yield ip
