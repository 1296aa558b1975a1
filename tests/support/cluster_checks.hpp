// Checks shared by the tests that run `starling node` processes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "support/subprocess.hpp"

namespace starling::testing {

/// Every node process exits 0 within `timeout`; the output of one that does not is shown.
inline void check_nodes_exit(std::vector<std::unique_ptr<subprocess>>& nodes,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  for (auto& n : nodes) {
    auto rc = n->wait_exit(timeout);
    CHECK(rc == 0);
    if (rc != 0)
      MESSAGE("a node ended with ", rc ? std::to_string(*rc) : "no exit", "; its output:\n",
              n->output());
  }
}

} // namespace starling::testing
