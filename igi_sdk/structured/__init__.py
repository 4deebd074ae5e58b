"""Structured output (pure: stdlib only): GBNF checks, the JSON-Schema subset and its validator, tool envelopes.

``gbnf`` checks grammars before they reach llama.cpp, ``json_schema`` checks a schema against the subset the
converter turns into an equivalent grammar and validates replies against it, ``tools`` builds the grammar-
constrained tool-call format and reads the model's answer back. The conversion itself (llama-cpp-python's
JSON-Schema-to-GBNF converter) is ``igi_sdk.engine.schema_grammar``.
"""
