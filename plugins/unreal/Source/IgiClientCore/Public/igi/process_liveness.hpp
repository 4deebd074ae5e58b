// igi/process_liveness.hpp - IgiClientCore, shared leaf: whether the daemon a connection file names still runs.
//
// A connection file names the daemon's pid and, on Linux, its start time in clock ticks since boot
// ("pid_start_ticks", /proc/PID/stat field 22; ipc/PROTOCOL.md section 13). A process that has the pid now but
// started at another time is another process: the kernel gave the dead daemon's pid to it.
#pragma once

#include <cstdint>
#include <optional>

namespace igi {

/// The start time of process `pid` in clock ticks since boot (Linux /proc), or nullopt.
std::optional<std::int64_t> ProcessStartTicks(std::int64_t pid);

/// false: no process has `pid`, or the one that has it started at another time than `start_ticks`. true: it runs
/// (with that start time, or none recorded, or none readable). nullopt: this platform cannot tell (Windows), or the
/// pid is not a process id.
std::optional<bool> ProcessRunning(std::int64_t pid, std::optional<std::int64_t> start_ticks);

/// The id of this process (getpid, GetCurrentProcessId): what the launcher passes to the daemon as --exit-with-pid.
std::int64_t CurrentProcessId();

}  // namespace igi
