"""Daemon layer, worker side: the engine worker process, the only daemon code that runs llama.cpp.

``main`` is the process entry point (commands in, events out over the worker pipe), ``scheduler`` serves the
daemon's generate jobs with the engine's continuous batching (every ``n_seq_max``, 1 included), and
``engine_adapter`` wraps ``LlamaEngine`` with the chat template, samplers and the daemon's placement overrides.
Nothing here is imported by the daemon's I/O side except ``main`` (by reference, as the spawn target); this
package imports nothing heavy at import time: ``main`` hides the GPU before llama.cpp is loaded.
"""
