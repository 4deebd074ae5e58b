"""Daemon layer: the engine worker as the daemon sees it: its protocol (typed commands and events, one codec; both
processes import it), its lifecycle (the one stored state and what each event or exit means in it), the supervisor
that spawns and watches the process, the pipe writer, the events routed to their owners, the model switch, the vision
projector check and the worker's CPU priority. The child process itself is ``daemon/engine_process/``."""
