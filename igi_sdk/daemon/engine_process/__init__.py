"""Daemon layer, worker side: the engine worker process, the only daemon code that runs llama.cpp.

``boot`` is the process entry point (llama.cpp loaded first), ``main`` the worker's loop (commands in, events out
over the worker pipe), ``scheduler`` serves the daemon's generate jobs with the engine's continuous batching (every
``n_seq_max``, 1 included), and ``engine_adapter`` wraps ``LlamaEngine`` with the chat template, samplers and the
daemon's placement overrides.
Nothing here is imported by the daemon's I/O side except ``boot`` (by reference, as the spawn target); this
package imports nothing heavy at import time: ``boot`` hides the GPU and loads llama.cpp before anything else.
"""
