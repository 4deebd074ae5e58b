"""The generators of the committed files in ``ipc/``, which test the wire protocol in the three languages: the
golden vectors (``cases.py``, rendered by ``vectors.py``) and the JSON Schemas (``schemas.py``).

Test helpers, not part of the shipped package. ``python -m tests.ipc_golden`` (from the repository root) rewrites
both after a change to ``igi_sdk/ipc/``; ``tests/conformance/test_vectors_python.py`` and
``tests/unit/test_ipc_schemas.py`` fail while the committed files are stale. The modules import each other
relatively: pytest imports them as ``ipc_golden`` (``tests/`` on ``sys.path``), ``python -m`` as ``tests.ipc_golden``.
"""
