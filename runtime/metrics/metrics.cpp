#include "runtime/metrics/metrics.hpp"

#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace starling::runtime {

jsonl_writer::jsonl_writer(const std::string& path) : path_(path), out_(path) {
  // nop
}

void jsonl_writer::write(const nlohmann::json& j) {
  auto line = j.dump();
  std::lock_guard<std::mutex> g{mtx_};
  out_ << line << '\n';
  out_.flush();
}

bool make_dirs(const std::string& dir, std::string& why) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    why = fmt::format("cannot create {}: {}", dir, ec.message());
    return false;
  }
  return true;
}

std::string default_out_dir(const std::string& name) {
  auto t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return fmt::format("runs/{}-{}", buf, name);
}

uint64_t peak_rss_bytes() {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

} // namespace starling::runtime
