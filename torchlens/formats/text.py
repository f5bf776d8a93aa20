"""Where bytes handed to a JSON reader stop being UTF-8 text.

msgspec reports bad UTF-8 differently across releases (a ``UnicodeDecodeError``
before 0.23, a ``DecodeError`` worded "Invalid UTF-8 encoded string" since), so
the readers ask the bytes themselves once a decode has failed, never the
wording of the error.
"""

from __future__ import annotations


def first_bad_utf8_byte(data: bytes) -> int | None:
    """The offset of the first byte that is not valid UTF-8, or None if all are."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None
