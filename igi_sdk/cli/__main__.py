"""``python -m igi_sdk.cli COMMAND ...``: the same as the ``igi`` console script."""

from igi_sdk.cli import main

raise SystemExit(main())
