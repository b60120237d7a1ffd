"""``python -m cpersona``: the same entry point as the ``cpersona`` command."""

from cpersona.cli import main

raise SystemExit(main())
