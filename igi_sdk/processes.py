"""Whether the process a file names still runs: a pid, and its start time so that a reused pid is not taken for it.

A daemon records its pid and, where ``/proc`` has it, its start time in clock ticks since boot (the owner file of its
private ipc directory, its connection file's ``pid_start_ticks``). A process that has the pid now but started at
another time is another process: the kernel gave the dead daemon's pid to it. :class:`ProcessWatch` holds on to a
running process instead (the game a daemon exits with). Stdlib only: the daemon and the client both ask.
"""

from __future__ import annotations

import functools
import os
import select
import sys
from typing import Any


def process_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None where
    there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # field 2 (comm) is parenthesised and may hold spaces or parentheses: count fields after its last ")"
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started (clock-tick resolution: 10 ms on Linux), or None without ``/proc``."""
    ticks = process_start_ticks(pid)
    try:
        with open("/proc/uptime", "rb") as f:
            uptime_s = float(f.read().split()[0])
        hertz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return None if ticks is None else max(0.0, uptime_s - ticks / hertz)


def process_running(pid: int, start_ticks: int | None) -> bool | None:
    """Whether the process that recorded ``pid`` (and ``start_ticks``, None: not recorded) still runs.

    False: no process has the pid, or the one that has it started at another time (a reused pid). True: the pid runs
    and its start time matches (or was not recorded, or cannot be read here). None: this platform cannot tell
    (Windows, where ``os.kill(pid, 0)`` is not a probe), or the pid is not a process id.
    """
    if pid <= 0 or sys.platform == "win32" or not hasattr(os, "getuid"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the pid: the start time decides
    except (OSError, OverflowError):
        return None
    if start_ticks is None:
        return True  # no start time recorded: a live pid counts as the recorder
    now = process_start_ticks(pid)
    return now is None or now == start_ticks


class ProcessWatch:
    """Whether one process, taken hold of while it runs, has exited since: the process a daemon was told to exit with.

    Linux: a pidfd (``os.pidfd_open``), readable once the process exits, never confused with a later process that
    gets its pid. Windows: a process handle with ``SYNCHRONIZE`` access, signalled once it exits. Elsewhere (macOS):
    the pid probed with ``os.kill(pid, 0)``, with its start time where ``/proc`` has it.

    Example:
        >>> watch = ProcessWatch.open(os.getpid())
        >>> watch.exited()
        False
        >>> watch.close()
    """

    def __init__(self, pid: int, pidfd: int | None, handle: int | None, start_ticks: int | None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._handle = handle
        self._start_ticks = start_ticks
        self._poll: select.poll | None = None  # poll, not select: a descriptor may be above FD_SETSIZE
        if pidfd is not None:
            self._poll = select.poll()
            self._poll.register(pidfd, select.POLLIN)

    @classmethod
    def open(cls, pid: int) -> ProcessWatch:
        """Take hold of process ``pid``.

        Raises:
            ProcessLookupError: no process has that pid (it may have exited already), or the pid is not a process id.
            PermissionError: the process is another user's (Windows, where no handle is granted).
        """
        if pid <= 0:
            raise ProcessLookupError(f"{pid} is not a process id")
        if sys.platform == "win32":
            return cls(pid, None, _open_process_handle(pid), None)
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                return cls(pid, pidfd_open(pid), None, None)
            except ProcessLookupError:
                raise
            except OSError:
                pass  # a kernel before 5.3: probed by pid below
        if process_running(pid, None) is False:
            raise ProcessLookupError(f"no process has pid {pid}")
        return cls(pid, None, None, process_start_ticks(pid))

    def exited(self) -> bool:
        """Whether the process has exited (never blocks)."""
        if self._poll is not None:
            return bool(self._poll.poll(0))
        if self._handle is not None:
            return _handle_signalled(self._handle)
        return process_running(self.pid, self._start_ticks) is False

    def close(self) -> None:
        """Let go of the process (its pidfd or handle)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd, self._poll = None, None
        if self._handle is not None:
            _close_handle(self._handle)
            self._handle = None


# Windows: kernel32 through ctypes (stdlib). SYNCHRONIZE lets WaitForSingleObject wait on the process.
_SYNCHRONIZE = 0x00100000
_WAIT_OBJECT_0 = 0
_ERROR_ACCESS_DENIED = 5


@functools.lru_cache(maxsize=1)
def _kernel32() -> Any:
    import ctypes

    return ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]


def _open_process_handle(pid: int) -> int:
    import ctypes

    kernel32 = _kernel32()
    kernel32.OpenProcess.restype = ctypes.c_void_p
    handle = kernel32.OpenProcess(_SYNCHRONIZE, False, pid)
    if not handle:
        error = ctypes.get_last_error()  # type: ignore[attr-defined]
        if error == _ERROR_ACCESS_DENIED:
            raise PermissionError(f"no handle to process {pid}: access denied")
        raise ProcessLookupError(f"no process has pid {pid} (OpenProcess error {error})")
    return int(handle)


def _handle_signalled(handle: int) -> bool:
    import ctypes

    kernel32 = _kernel32()
    kernel32.WaitForSingleObject.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    return bool(kernel32.WaitForSingleObject(handle, 0) == _WAIT_OBJECT_0)


def _close_handle(handle: int) -> None:
    import ctypes

    kernel32 = _kernel32()
    kernel32.CloseHandle.argtypes = [ctypes.c_void_p]
    kernel32.CloseHandle(handle)
