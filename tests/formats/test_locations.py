"""Which files are the user's: decided by where library code really lives,
not by a folder's name (a clone named ``torchlens`` is the user's code)."""

from __future__ import annotations

import os

import torch

import torchlens
from torchlens.formats.locations import is_user_file


def test_a_users_file_in_a_folder_named_torchlens_is_theirs(tmp_path):
    # what `git clone .../torchlens` gives: the user's tests and scripts
    # live under a folder of our name, and must keep their call sites
    script = tmp_path / "torchlens" / "tests" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("x = 1\n")
    assert is_user_file(str(script))
    named_torch = tmp_path / "torch" / "model.py"
    named_torch.parent.mkdir()
    named_torch.write_text("x = 1\n")
    assert is_user_file(str(named_torch))


def test_the_installed_libraries_are_never_the_users():
    ours = os.path.join(os.path.dirname(torchlens.__file__), "formats", "locations.py")
    assert not is_user_file(ours)
    assert not is_user_file(torch.nn.functional.__file__)
    assert not is_user_file(os.__file__)


def test_frames_recorded_on_another_machine_are_judged_by_their_path():
    # a snapshot from someone else's GPU run: the files are not here
    assert not is_user_file("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py")
    assert not is_user_file("/opt/conda/lib/python3.11/site-packages/transformers/trainer.py")
    assert not is_user_file("/opt/pytorch/torch/nn/modules/linear.py")
    assert not is_user_file("<frozen runpy>")
    assert is_user_file("/home/alice/project/train.py")
    assert is_user_file("/tmp/ipykernel_4242/123456.py")
