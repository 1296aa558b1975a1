// Files a tracked Python script writes for tests (TorchScript modules, token files), made once
// per build and shared by every test process: CTest runs each test case in its own process, and
// scripting a model costs seconds.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>
#include "support/paths.hpp"

namespace starling::testing {

/// The folder `/usr/bin/python3 <script> <folder> <args...>` filled, under the build folder and
/// keyed by the contents of `inputs` (the script and what it imports) and `args`: generated
/// into a fresh folder and renamed into place, so concurrent tests share one result. Fails (never
/// skips) when /usr/bin/python3 is missing or the script fails.
inline std::string python_fixtures(const std::string& script, const std::vector<std::string>& args,
                                   const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  REQUIRE_MESSAGE(fs::exists("/usr/bin/python3"),
                  "/usr/bin/python3 is missing: install python3-torch (scripts/install-deps)");
  std::string key = script;
  for (auto& a : args)
    key += "\n" + a;
  for (auto& f : inputs) {
    std::ifstream in{f, std::ios::binary};
    REQUIRE_MESSAGE(in, "cannot read " << f);
    std::ostringstream text;
    text << in.rdbuf();
    key += "\n" + text.str();
  }
  auto root = fs::path{STARLING_BUILD_DIR} / "test-fixtures";
  auto dir = root / (fs::path{script}.stem().string() + "-"
                     + std::to_string(std::hash<std::string>{}(key)));
  if (fs::exists(dir / "done"))
    return dir.string();
  fs::create_directories(root);
  auto tmp = root / ("tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  std::string cmd = "/usr/bin/python3 " + script + " " + tmp.string();
  for (auto& a : args)
    cmd += " " + a;
  cmd += " >/dev/null";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "the fixture script failed: " << cmd);
  std::ofstream{tmp / "done"} << "ok\n";
  std::error_code ec;
  fs::rename(tmp, dir, ec); // another process may have won: its copy is the same
  if (ec)
    fs::remove_all(tmp);
  REQUIRE(fs::exists(dir / "done"));
  return dir.string();
}

} // namespace starling::testing
