#include "runtime/log/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace starling::runtime {

namespace {

// The only process-wide state of the runtime: a threshold and a start time for timestamps.
std::atomic<int> threshold{static_cast<int>(log_level::info)};
const auto process_start = std::chrono::steady_clock::now();
std::mutex output_mutex;

const char* level_name(log_level l) {
  switch (l) {
    case log_level::debug:
      return "debug";
    case log_level::info:
      return "info";
    case log_level::warning:
      return "warn";
    default:
      return "error";
  }
}

} // namespace

log_level parse_log_level(std::string_view text) {
  if (text == "debug")
    return log_level::debug;
  if (text == "warning" || text == "warn")
    return log_level::warning;
  if (text == "error")
    return log_level::error;
  return log_level::info;
}

void set_log_level(log_level level) {
  threshold = static_cast<int>(level);
}

log_level current_log_level() {
  return static_cast<log_level>(threshold.load());
}

void write_log(log_level level, std::string_view prefix, std::string_view text) {
  auto t = std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start);
  auto line = fmt::format("[{:9.3f} {:5} {}] {}\n", t.count(), level_name(level), prefix, text);
  std::lock_guard<std::mutex> guard{output_mutex};
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

int print_error(std::string_view what) {
  fmt::print(stderr, "starling: error: {}\n", what);
  return 2;
}

} // namespace starling::runtime
