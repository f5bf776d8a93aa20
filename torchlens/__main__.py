"""``python -m torchlens`` is the ``torchlens`` command."""

from .frontends.cli import main

raise SystemExit(main())
