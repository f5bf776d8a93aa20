"""``python -m torchlens`` is the ``torchlens`` command."""

from torchlens.frontends.cli.main import main

raise SystemExit(main())
