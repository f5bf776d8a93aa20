"""The ranks' job keeps its code's file names (``capture.channel.pickling``).

cloudpickle 3.1.3 started sending every function pickled by value with the
file name ``<dynamic-code>``; every call site, traceback and hang stack the
ranks report would then name that instead of the user's file or cell.
"""

from __future__ import annotations

import pickle
import traceback

import cloudpickle

from torchlens.capture.channel import pickling


def test_a_function_sent_by_value_keeps_its_file_and_its_nested_code():
    def step(x: int) -> int:
        def inner() -> int:
            raise ValueError(f"bad batch {x}")
        return inner()

    back = pickle.loads(pickling.dumps({"fn": step}))["fn"]
    assert back is not step and back.__code__.co_filename == __file__
    try:
        back(3)
    except ValueError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
    assert [f.filename for f in frames[-2:]] == [__file__, __file__]
    assert [f.name for f in frames[-2:]] == ["step", "inner"]
    # what it is there for: plain cloudpickle (3.1.3 on) loses the name
    plain = pickle.loads(cloudpickle.dumps(step))
    if tuple(int(p) for p in cloudpickle.__version__.split(".")[:3]) >= (3, 1, 3):
        assert plain.__code__.co_filename == "<dynamic-code>"
