#include "runtime/cli/signals.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <unistd.h>

namespace starling::runtime {

namespace {

int pipe_fds[2] = {-1, -1};

extern "C" void on_shutdown_signal(int sig) {
  auto saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(pipe_fds[1], &b, 1);
  errno = saved;
}

} // namespace

void install_shutdown_signals() {
  if (pipe_fds[0] >= 0)
    return;
  if (::pipe(pipe_fds) != 0)
    return;
  ::fcntl(pipe_fds[0], F_SETFD, FD_CLOEXEC);
  ::fcntl(pipe_fds[1], F_SETFD, FD_CLOEXEC);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_shutdown_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int wait_for_shutdown_signal() {
  install_shutdown_signals();
  unsigned char b = 0;
  for (;;) {
    auto n = ::read(pipe_fds[0], &b, 1);
    if (n == 1)
      return b;
    if (n < 0 && errno == EINTR)
      continue;
    return 0;
  }
}

int poll_shutdown_signal(int timeout_ms) {
  install_shutdown_signals();
  pollfd p{pipe_fds[0], POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1)
    return -1;
  unsigned char b = 0;
  return ::read(pipe_fds[0], &b, 1) == 1 ? b : -1;
}

signal_watcher::signal_watcher(bool second_kills, std::string first_line) {
  install_shutdown_signals();
  thread_ = std::thread{[stop = stop_, second_kills, line = std::move(first_line)] {
    if (wait_for_shutdown_signal() == 0)
      return;
    if (second_kills) {
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
    }
    if (!line.empty()) {
      std::fprintf(stderr, "\nstarling: %s\n", line.c_str());
      std::fflush(stderr);
    }
    stop->store(true);
    (void)wait_for_shutdown_signal(); // stays, the thread that takes a second signal
  }};
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

signal_watcher::~signal_watcher() {
  wake_shutdown_waiter();
  thread_.join();
}

std::function<bool()> signal_watcher::stopped() const {
  return [stop = stop_] { return stop->load(); };
}

void wake_shutdown_waiter() {
  install_shutdown_signals();
  unsigned char b = 0;
  [[maybe_unused]] auto n = ::write(pipe_fds[1], &b, 1);
}

} // namespace starling::runtime
