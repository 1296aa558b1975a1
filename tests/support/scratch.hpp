// An empty folder of its own under the temporary directory, removed with everything in it: one
// per test process and name (the pid keeps parallel test processes apart).
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

namespace starling::testing {

struct scratch {
  explicit scratch(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch() { std::filesystem::remove_all(path); }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  std::filesystem::path path;
};

} // namespace starling::testing
