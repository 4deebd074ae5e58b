// process_liveness.cpp - IgiClientCore, shared leaf: pid and start time of the daemon a connection file names, and
// this process's own id.
#include "igi/process_liveness.hpp"

#include <fstream>
#include <sstream>
#include <string>

#ifndef _WIN32
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#else
#include <process.h>  // _getpid: the CRT's process id (GetCurrentProcessId's), without <windows.h> and its macros
#endif

namespace igi {

std::optional<std::int64_t> ProcessStartTicks(std::int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat", std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  // field 2 (comm) is parenthesised and may hold spaces or parentheses: count the fields after its last ')'
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 0; i < 20; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  try {
    std::size_t used = 0;
    const long long ticks = std::stoll(field, &used);
    if (used != field.size() || ticks < 0) return std::nullopt;
    return static_cast<std::int64_t>(ticks);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<bool> ProcessRunning(std::int64_t pid, std::optional<std::int64_t> start_ticks) {
#ifdef _WIN32
  (void)pid;
  (void)start_ticks;
  return std::nullopt;
#else
  if (pid <= 0 || pid > static_cast<std::int64_t>(INT32_MAX)) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) {
    if (errno == ESRCH) return false;
    if (errno != EPERM) return std::nullopt;  // EPERM: a process of another user has the pid; the start time decides
  }
  if (!start_ticks) return true;
  const std::optional<std::int64_t> now = ProcessStartTicks(pid);
  return !now || *now == *start_ticks;
#endif
}

std::int64_t CurrentProcessId() {
#ifdef _WIN32
  return static_cast<std::int64_t>(::_getpid());
#else
  return static_cast<std::int64_t>(::getpid());
#endif
}

}  // namespace igi
