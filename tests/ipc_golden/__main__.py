"""``python -m tests.ipc_golden``: rewrite the golden vectors in ``ipc/vectors/`` and the schemas in ``ipc/schemas/``."""

from __future__ import annotations

from . import schemas, vectors


def main() -> int:
    for path in [*vectors.write_all(), *schemas.write_all()]:
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
