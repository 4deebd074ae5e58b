"""Daemon layer (engine worker): the abort flags shared with the daemon, and which of them llama.cpp reads.

The supervisor sets ``STOP_ANY_STEP`` for every stop of the step in flight, and ``STOP_REDONE_STEP`` too for a stop
that must not wait for any step (a shrink, a shutdown; ``worker.protocol``'s docstring). llama.cpp reads one address
(``LlamaEngine.abort_on_flag``, patches/llama.cpp 0005): the first flag's during a step, the second's during the step
the worker does again after a stopped one, so a growth's stop cannot keep every step from ending, while a shrink still
stops any.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from igi_sdk.daemon.worker.protocol import STOP_ANY_STEP, STOP_REDONE_STEP


class StopFlags:
    """The worker's end of the abort flags (a ``RawArray`` of two C ints).

    Args:
        flags: the shared flags.
        watch: points llama.cpp's abort check at an address (``LlamaEngine.abort_on_flag``).
    """

    def __init__(self, flags: Any, watch: Callable[[int], object]) -> None:
        self._flags = flags
        self._watch = watch
        self._index = STOP_ANY_STEP
        watch(self._address(STOP_ANY_STEP))

    @property
    def set(self) -> bool:
        """Whether a stop was asked for (a ``Reload`` on its way, or about to be)."""
        return bool(self._flags[STOP_ANY_STEP])

    @property
    def watched(self) -> int:
        """The index of the flag llama.cpp reads during the next step."""
        return self._index

    def taken_up(self) -> None:
        """A ``Reload`` was taken up: the steps after it run to their end again."""
        self._flags[STOP_ANY_STEP] = 0
        self._flags[STOP_REDONE_STEP] = 0

    def after_step(self, stopped: bool) -> None:
        """The step ended (``stopped``: the flag stopped it, and it was undone): the next step, which does it again,
        stops only for a stop that spares no step; any other step for any stop."""
        index = STOP_REDONE_STEP if stopped else STOP_ANY_STEP
        if index != self._index:
            self._index = index
            self._watch(self._address(index))

    def _address(self, index: int) -> int:
        return ctypes.addressof(self._flags) + index * ctypes.sizeof(ctypes.c_int)
