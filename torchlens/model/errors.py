"""Errors a user can act on.

Every error raised for bad input is a ``TorchlensError`` whose message says what
was wrong and what to do, so frontends can print it in one line instead of a
traceback from deep inside a parser.
"""


class TorchlensError(Exception):
    """Base class: the message is meant for the user, verbatim."""


class InputError(TorchlensError, ValueError):
    """A file, option or value given by the user cannot be used."""


class FormatVersionError(InputError):
    """A saved file was written by a newer, incompatible torchlens."""


class PathNotFoundError(InputError, FileNotFoundError):
    """An input path that does not exist: an ``InputError`` (every front end says
    it in one line) that is also the ``FileNotFoundError`` a caller expects."""


def shown_alone(exc: TorchlensError) -> TorchlensError:
    """``exc`` as a notebook shows it: its one line, not the frames that found
    the input wrong (IPython draws an exception's ``_render_traceback_`` in
    place of its traceback; a plain Python traceback is unchanged)."""
    exc.__traceback__ = None
    exc._render_traceback_ = lambda: [f"{type(exc).__name__}: {exc}"]  # type: ignore[attr-defined]
    return exc
