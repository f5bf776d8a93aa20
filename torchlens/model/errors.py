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
