"""Daemon layer: what a client asks: frames decoded, verified and routed (the dispatcher), the handlers of each
request family, the checks of grammars, schemas and tools at the edge, and the liveness of clients and sessions."""
