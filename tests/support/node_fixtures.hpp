// Fixtures shared by tests that start real nodes on loopback or need a scratch folder: a
// temporary directory removed on scope exit, CAF options with short heartbeats, and a node of a
// given experiment started in this process.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include <doctest/doctest.h>
#include <stdlib.h>

#include "runtime/node/node.hpp"

namespace starling::testing {

/// A fresh folder under the system's temporary directory (named `<prefix>-` and six random
/// characters, as mkdtemp makes it), removed with everything in it when the object goes.
struct temp_dir {
  std::string path;
  explicit temp_dir(const std::string& prefix = "starling-test") {
    auto tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// CAF options for in-process test nodes: quick heartbeats and connection timeouts.
inline runtime::caf_options fast_caf() {
  using namespace std::chrono_literals;
  runtime::caf_options o;
  o.heartbeat_interval = 100ms;
  o.connection_timeout = 1s;
  return o;
}

/// A node named `name` of experiment `experiment`, started on loopback (fails the test if not).
inline std::unique_ptr<runtime::node> start_node(const std::string& name,
                                                 const std::string& experiment) {
  runtime::node_options no;
  no.experiment = experiment;
  auto n = runtime::node::start(fast_caf(), no, name);
  REQUIRE(n.ok());
  return std::move(*n);
}

} // namespace starling::testing
