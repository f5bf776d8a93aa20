"""What every ``torchlens`` subcommand is (``Command``), in a module of its own so
that subcommands kept in other modules (``cli_diff``) need not import ``cli``,
which runs as ``__main__`` under ``python -m torchlens.frontends.cli.main``."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchlens.model import InputError


def must_exist(path: str) -> None:
    """One line when an input path is missing (before anything is read)."""
    if not Path(path).exists():
        raise InputError(f"{path}: no such file or folder. Check the path.")


class Command:
    """One subcommand: ``name``, ``help``, its arguments and what it does."""

    name = ""
    help = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare this command's arguments on its own subparser."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the work; return the exit status. Raise InputError for bad input."""
        raise NotImplementedError
