"""Daemon layer: NPC sessions: the table of open sessions, their images, the session file format and the files read
and written in background threads."""
