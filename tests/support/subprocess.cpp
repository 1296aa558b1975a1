#include "support/subprocess.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace starling::testing {

subprocess::subprocess(const std::vector<std::string>& argv, bool merge_stderr) {
  int fds[2];
  if (pipe(fds) != 0)
    return;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    if (merge_stderr)
      dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  fd_ = fds[0];
}

subprocess::~subprocess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0)
    close(fd_);
}

std::optional<std::string> subprocess::read_line(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      auto line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (fd_ < 0)
      return std::nullopt;
    // With no time left, one look without waiting: a zero timeout reads what is already there.
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0)
      return std::nullopt;
    char chunk[4096];
    auto n = ::read(fd_, chunk, sizeof(chunk));
    if (n <= 0)
      return std::nullopt;
    buf_.append(chunk, static_cast<size_t>(n));
    seen_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<std::string> subprocess::wait_for(const std::string& needle,
                                                std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return std::nullopt;
    auto line = read_line(left);
    if (!line)
      return std::nullopt;
    if (line->find(needle) != std::string::npos)
      return line;
  }
}

void subprocess::signal(int sig) {
  if (pid_ > 0 && !exited_)
    kill(pid_, sig);
}

void subprocess::drain() {
  // The child is gone: whatever it wrote is in the pipe until EOF.
  char chunk[4096];
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0)
      return;
    auto n = ::read(fd_, chunk, sizeof(chunk));
    if (n <= 0)
      return;
    buf_.append(chunk, static_cast<size_t>(n));
    seen_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<int> subprocess::wait_exit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0)
    return std::nullopt;
  // Waits on the child's pipe closing (no polling sleep), then reaps it.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited_) {
    int status = 0;
    auto r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      drain();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50))) > 0) {
      char chunk[4096];
      auto n = ::read(fd_, chunk, sizeof(chunk));
      if (n > 0) {
        buf_.append(chunk, static_cast<size_t>(n));
        seen_.append(chunk, static_cast<size_t>(n));
      } else {
        // EOF: the child closed its output; block until it is reaped.
        if (waitpid(pid_, &status, 0) == pid_) {
          exited_ = true;
          drain();
          return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
      }
    }
  }
  return std::nullopt;
}

std::string endpoint_of(const std::string& listening_line) {
  auto start = listening_line.find("on ") + 3;
  return listening_line.substr(start, listening_line.find_first_of(" \n", start) - start);
}

std::vector<std::unique_ptr<subprocess>>
start_nodes(int count, const std::function<std::vector<std::string>(int)>& argv_of,
            std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<subprocess>> nodes;
  std::string first;
  for (int i = 0; i < count; ++i) {
    auto argv = argv_of(i);
    if (i > 0) {
      argv.push_back("--join");
      argv.push_back(first);
    }
    nodes.push_back(std::make_unique<subprocess>(argv));
    auto line = nodes.back()->wait_for("listening on", timeout);
    if (!line)
      return {};
    if (i == 0)
      first = endpoint_of(*line);
  }
  return nodes;
}

} // namespace starling::testing
