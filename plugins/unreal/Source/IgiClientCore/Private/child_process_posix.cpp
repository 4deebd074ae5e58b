// child_process_posix.cpp - IgiClientCore: the POSIX ChildProcess backend (fork + execve, one output pipe).
#include "igi/daemon_launcher.hpp"

#ifndef _WIN32
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;
#endif

namespace igi {

#ifndef _WIN32
namespace {

class PosixChild final : public ChildProcess {
 public:
  PosixChild(pid_t pid, int out_fd) : pid_(pid), out_fd_(out_fd) {}
  ~PosixChild() override {
    int code = 0;
    if (!Exited(&code)) {  // never leave a zombie or a running daemon behind an owner that forgot it
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
  }

  std::int64_t pid() const override { return pid_; }

  bool Exited(int* exit_code) override {
    if (exited_) {
      *exit_code = exit_code_;
      return true;
    }
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == 0) return false;
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
    } else {
      exit_code_ = -1;  // ECHILD: reaped elsewhere
    }
    exited_ = true;
    *exit_code = exit_code_;
    return true;
  }

  void ReadLines(std::vector<std::string>* lines) override {
    if (out_fd_ < 0) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n > 0) {
        pending_.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) {  // every writer closed (the daemon and its worker are gone)
        ::close(out_fd_);
        out_fd_ = -1;
      } else if (errno == EINTR) {
        continue;
      }
      break;
    }
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending_.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines->push_back(std::move(line));
    }
    pending_.erase(0, start);
    if (out_fd_ < 0 && !pending_.empty()) {
      lines->push_back(pending_);
      pending_.clear();
    }
  }

  bool Terminate() override {
    int code = 0;
    return !Exited(&code) && ::kill(pid_, SIGTERM) == 0;
  }

  void Kill() override {
    int code = 0;
    if (!Exited(&code)) ::kill(pid_, SIGKILL);
  }

 private:
  pid_t pid_;
  int out_fd_;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string pending_;
};

}  // namespace

std::unique_ptr<ChildProcess> SpawnNativeProcess(const std::string& executable, const std::vector<std::string>& arguments,
                                                 const std::string& working_directory) {
  if (::access(executable.c_str(), X_OK) != 0) {
    throw LaunchError("cannot execute " + executable + ": " + std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_s{executable};
  argv_s.insert(argv_s.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    if (kv.rfind("PYTHONHOME=", 0) == 0 || kv.rfind("PYTHONPATH=", 0) == 0 || kv.rfind("PYTHONSTARTUP=", 0) == 0) continue;
    env_s.push_back(kv);
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const long max_fd_l = ::sysconf(_SC_OPEN_MAX);
  const int max_fd = max_fd_l > 0 && max_fd_l < 65536 ? static_cast<int>(max_fd_l) : 65536;

  int fds[2];
  if (::pipe(fds) != 0) throw LaunchError(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw LaunchError(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    for (int fd = 3; fd < max_fd; ++fd) ::close(fd);  // the game's sockets and files stay the game's
    if (!working_directory.empty() && ::chdir(working_directory.c_str()) != 0) ::_exit(126);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  return std::make_unique<PosixChild>(pid, fds[0]);
}

#else

std::unique_ptr<ChildProcess> SpawnNativeProcess(const std::string& executable, const std::vector<std::string>&,
                                                 const std::string&) {
  throw LaunchError("SpawnNativeProcess is POSIX only; on Windows pass DaemonLauncherOptions::spawner (IgiRuntime "
                    "passes one built on FPlatformProcess) to start " + executable);
}

#endif

}  // namespace igi
