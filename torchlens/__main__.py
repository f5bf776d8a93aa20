"""``python -m torchlens`` is the ``torchlens`` command."""

from torchlens.frontends.cli import main

raise SystemExit(main())
