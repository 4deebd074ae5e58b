"""Headless sample harness: a simulated game loop with talking NPCs driving a real IGI daemon.

``samples/harness.py`` is the entry point (``./dev.sh demo``); ``docs/harness.md`` explains the output.
"""
