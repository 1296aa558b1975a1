#include <doctest/doctest.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::actors_dht_process_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

/// The `HOST:PORT` from a `dht listening on HOST:PORT id ...` line.
std::string endpoint_of(const std::string& line) {
  auto start = line.find("on ") + 3;
  return line.substr(start, line.find(' ', start) - start);
}

} // namespace

TEST_CASE("8 dht processes on loopback: a value stored through one is read through another") {
  std::vector<std::unique_ptr<subprocess>> nodes;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::string> argv{STARLING_BINARY, "dht", "--listen", "127.0.0.1:0"};
    if (i > 0) {
      argv.push_back("--join");
      argv.push_back(endpoints[0]);
    }
    nodes.push_back(std::make_unique<subprocess>(argv));
    auto line = nodes.back()->wait_for("dht listening on", 30s);
    REQUIRE(line);
    endpoints.push_back(endpoint_of(*line));
    if (i > 0)
      REQUIRE(nodes.back()->wait_for("peers known", 30s));
  }
  subprocess store{{STARLING_BINARY, "dht", "store", "--node", endpoints[2], "greeting",
                    "hello from 2", "--ttl", "60s"}};
  auto stored = store.wait_for("stored on", 30s);
  REQUIRE(stored);
  CHECK(stored->find("stored on 0 ") == std::string::npos);
  CHECK(store.wait_exit(30s) == 0);
  subprocess get{{STARLING_BINARY, "dht", "get", "--node", endpoints[6], "greeting"}};
  auto value = get.wait_for("greeting = ", 30s);
  REQUIRE(value);
  CHECK(value->find("hello from 2") != std::string::npos);
  CHECK(get.wait_exit(30s) == 0);
  subprocess missing{{STARLING_BINARY, "dht", "get", "--node", endpoints[5], "nothing-here"}};
  CHECK(missing.wait_for("not found", 30s));
  CHECK(missing.wait_exit(30s) == 1);
  for (auto& n : nodes) {
    n->signal(SIGTERM);
    CHECK(n->wait_exit(30s) == 0);
  }
}

} // namespace starling::test::actors_dht_process_test
