"""The reliability suite's short form: every test here carries the ``reliability`` marker (``-m reliability`` runs
the suite alone; ``./dev.sh test`` runs it with the rest). The long form is ``python -m tests.reliability.long_form``."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)
