// Metrics as JSON lines: one object per line, with a timestamp, appended to a file.
#pragma once

#include <fstream>
#include <mutex>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace starling::runtime {

/// Appends JSON objects to a file, one per line; safe to share between threads.
class jsonl_writer {
public:
  /// Opens (truncates) `path`; `ok()` tells whether it worked.
  explicit jsonl_writer(const std::string& path);
  bool ok() const { return out_.good(); }
  const std::string& path() const { return path_; }
  /// Writes one line.
  void write(const nlohmann::json& j);

private:
  std::string path_;
  std::ofstream out_;
  std::mutex mtx_;
};

/// Creates `dir` (and parents); returns false with a message in `why` on failure.
bool make_dirs(const std::string& dir, std::string& why);

/// `runs/<YYYYmmdd-HHMMSS>-<name>`, the default output folder.
std::string default_out_dir(const std::string& name);

/// Peak resident memory of this process in bytes (VmHWM), 0 if unknown.
uint64_t peak_rss_bytes();

} // namespace starling::runtime
