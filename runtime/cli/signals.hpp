// SIGINT/SIGTERM for long-running commands (`starling node`, `starling dht --listen`).
//
// Why not block the signals and `sigwait`: libraries start threads before `main` (OpenBLAS's
// thread pool does, from a shared-library constructor), and a process-directed signal goes to any
// thread that does not block it, where the default action kills the process. A handler is
// process-wide instead: whichever thread takes the signal writes its number into a self-pipe, and
// a waiter reads it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace starling::runtime {

/// Installs the handlers (idempotent). Call before starting anything long-running.
void install_shutdown_signals();

/// Blocks until SIGINT or SIGTERM arrives (returns its number) or `wake_shutdown_waiter` was
/// called (returns 0).
int wait_for_shutdown_signal();

/// Waits at most `timeout_ms` for SIGINT or SIGTERM: its number, or -1 when none came.
int poll_shutdown_signal(int timeout_ms);

/// Wakes a thread blocked in `wait_for_shutdown_signal` without a signal.
void wake_shutdown_waiter();

/// SIGINT/SIGTERM for a long-running command: the first sets `stopped()`; with `second_kills`, a
/// second ends the process at once (the default action; not for a cluster node, whose parent
/// passes the terminal's SIGINT on as a SIGTERM) and the first prints `first_line` (when not
/// empty) to stderr. Made before the actor system starts: the threads started after it block the
/// signals, so that none of CAF's or the transport's system calls is interrupted by one, and its
/// watcher thread, started before the block, takes them.
class signal_watcher {
public:
  signal_watcher(bool second_kills, std::string first_line);
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;
  ~signal_watcher();
  /// Whether a first signal came.
  std::function<bool()> stopped() const;

private:
  std::shared_ptr<std::atomic<bool>> stop_ = std::make_shared<std::atomic<bool>>(false);
  std::thread thread_;
};

} // namespace starling::runtime
