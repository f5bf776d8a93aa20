"""Sealed values: the MAC binds run, key and body; the secret never shows."""

from __future__ import annotations

import os
import stat

import pytest

from torchlens.capture.channel.signing import ENV_SECRET_FILE, Forged, RunKey


def test_a_sealed_value_opens_only_under_its_own_key_and_run():
    key = RunKey.new()
    data = key.seal("result/1", b'{"ok": true}')
    assert key.open("result/1", data) == b'{"ok": true}'
    with pytest.raises(Forged, match="bad signature"):
        key.open("result/2", data)  # replayed under another rank's key
    with pytest.raises(Forged, match="bad signature"):
        RunKey(key.run_id, os.urandom(32)).open("result/1", data)  # another run's secret
    with pytest.raises(Forged, match="bad signature"):
        RunKey("other", key.secret).open("result/1", data)
    tampered = data[:-1] + b"!"
    with pytest.raises(Forged):
        key.open("result/1", tampered)
    with pytest.raises(Forged, match="not signed"):
        key.open("result/1", b'{"ok": true}')


def test_the_secret_stays_out_of_repr_and_travels_by_env_or_a_private_file(tmp_path):
    key = RunKey.new()
    assert key.secret.hex() not in repr(key)
    assert RunKey.from_env(key.env()) == key
    path = key.write_secret(str(tmp_path / "secret"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert RunKey.from_env({"TORCHLENS_RUN_ID": key.run_id, ENV_SECRET_FILE: path}) == key
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        RunKey.from_env({"TORCHLENS_RUN_ID": key.run_id, ENV_SECRET_FILE: path})
    assert RunKey.from_env({}) is None


def test_a_channel_drops_an_earlier_runs_values_once_and_a_forged_count_blocks_nothing():
    from datetime import timedelta

    import torch.distributed as dist

    from torchlens.capture.channel.protocol import Channel

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    now, before = Channel(store, RunKey.new()), Channel(store, RunKey.new())
    before.set("hb/0", {"phase": "leftover"})  # a rank of an earlier run on this port
    for _ in range(3):  # re-read every poll, counted once
        assert now.get("hb/0") is None
    assert now.dropped == {"heartbeat": 1}
    now.set("hb/0", {"phase": "step 0"})
    assert now.get("hb/0") == {"phase": "step 0"}
    assert now.check("hb/0")  # a genuine value counts as set
    before.set("stop", 1)
    assert not now.check("stop") and now.dropped["stop"] == 1  # a forged stop stops no one
    now.set("steps/0/0", [{"step": 0}])
    store.add("steps/0/n", 2)  # a forged count: key 1 was never written
    keys = now.existing([f"steps/0/{i}" for i in range(int(store.add("steps/0/n", 0)))])
    assert keys == ["steps/0/0"]  # multi_get would have waited on steps/0/1
