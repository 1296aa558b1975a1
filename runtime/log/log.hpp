// Leveled logging through fmt: `[12.345 info node-1] message`, one line per call, to stderr.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace starling::runtime {

/// Severity of a log line.
enum class log_level { debug = 0, info = 1, warning = 2, error = 3 };

/// Parses `debug|info|warning|error`; unknown text gives `info`.
log_level parse_log_level(std::string_view text);

/// Sets the process-wide threshold (the CLI calls this once at start).
void set_log_level(log_level level);

/// The current threshold.
log_level current_log_level();

/// Writes one line with a timestamp (seconds since process start), level and prefix.
void write_log(log_level level, std::string_view prefix, std::string_view text);

/// Prints the one line `starling: error: WHAT` on stderr and returns 2, the exit code of bad
/// input (the CLI's answer to every error it can name).
int print_error(std::string_view what);

/// Logs `fmt`-formatted text under `prefix` (typically the actor's or node's name).
template <class... Ts>
void log(log_level level, std::string_view prefix, fmt::format_string<Ts...> f, Ts&&... xs) {
  if (level < current_log_level())
    return;
  write_log(level, prefix, fmt::format(f, std::forward<Ts>(xs)...));
}

} // namespace starling::runtime
