// A child process with its stdout read line by line, for multi-process tests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace starling::testing {

/// Starts `argv` with stdout (and stderr, if `merge_stderr`) on a pipe; kills it on destruction.
class subprocess {
public:
  explicit subprocess(const std::vector<std::string>& argv, bool merge_stderr = true);
  ~subprocess();
  subprocess(const subprocess&) = delete;
  subprocess& operator=(const subprocess&) = delete;

  /// The next line of output, or nothing if none came before `timeout` (or the pipe closed);
  /// a zero timeout returns a line only if one is already there (it never waits).
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  /// Reads lines until one contains `needle`; returns it, or nothing at timeout/EOF.
  std::optional<std::string> wait_for(const std::string& needle,
                                      std::chrono::milliseconds timeout);
  /// Sends a signal.
  void signal(int sig);
  /// Waits for the exit; the exit status (or 128 + signal), or nothing at timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// Everything read so far.
  const std::string& output() const { return seen_; }
  pid_t pid() const { return pid_; }

private:
  void drain();

  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string buf_;
  std::string seen_;
};

/// The `HOST:PORT` of a `... listening on HOST:PORT` line.
std::string endpoint_of(const std::string& listening_line);

/// Starts `count` node processes, `argv_of(i)` each (node 0 first; every later one gets
/// `--join HOST:PORT` of node 0 appended), each waited for until it prints "listening on".
/// Empty when one of them does not start in time.
std::vector<std::unique_ptr<subprocess>>
start_nodes(int count, const std::function<std::vector<std::string>(int)>& argv_of,
            std::chrono::milliseconds timeout = std::chrono::seconds(60));

} // namespace starling::testing
