// The gossip example (examples/gossip) is written only against the public API; it runs in all
// three modes from the same C++ graph and its peers converge despite preemptions.
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <regex>

#include <unistd.h>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::examples_gossip_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

const std::string binary = std::string{STARLING_BUILD_DIR} + "/example_gossip";

/// The relative errors (first, last) of the example's final line.
std::pair<double, double> errors_of(subprocess& p) {
  auto line = p.wait_for("gossip: relative error", 120s);
  REQUIRE(line);
  std::smatch m;
  REQUIRE(std::regex_search(*line, m, std::regex{R"(([0-9.e+-]+) -> ([0-9.e+-]+) \((\d+) faults)"}));
  CHECK(std::stoi(m[3]) > 0); // preemptions happened
  return {std::stod(m[1]), std::stod(m[2])};
}

std::string temp_dir() {
  char tmpl[] = "/tmp/starling-gossip-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

} // namespace

TEST_CASE("the gossip example converges in simulation, deterministically") {
  auto dir = temp_dir();
  std::string digest[2];
  for (int i = 0; i < 2; ++i) {
    subprocess p{{binary, "--sim", "--out", dir + "/sim" + std::to_string(i)}};
    auto [first, last] = errors_of(p);
    CHECK(last < first / 100);
    auto d = p.wait_for("trace digest", 30s);
    REQUIRE(d);
    // "trace digest HEX (N events; T s simulated in W s wall)": the digest and the event count
    // (the wall time differs from run to run).
    auto rest = d->substr(d->find("digest") + 6);
    digest[i] = rest.substr(0, rest.find(';'));
    CHECK(p.wait_exit(30s) == 0);
  }
  CHECK(digest[0] == digest[1]);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the gossip example converges in local mode") {
  auto dir = temp_dir();
  subprocess p{{binary, "--out", dir}};
  auto [first, last] = errors_of(p);
  CHECK(last < first / 100);
  CHECK(p.wait_exit(30s) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the gossip example converges as a 4-process cluster") {
  auto dir = temp_dir();
  auto nodes = starling::testing::start_nodes(4, [&](int i) {
    return std::vector<std::string>{binary, "node", "--index", std::to_string(i), "--nodes", "4",
                                    "--out", dir + "/n" + std::to_string(i)};
  });
  REQUIRE(nodes.size() == 4);
  auto [e0, e1] = errors_of(*nodes[0]);
  CHECK(e1 < e0 / 100);
  for (auto& n : nodes)
    CHECK(n->wait_exit(60s) == 0);
  std::filesystem::remove_all(dir);
}

} // namespace starling::test::examples_gossip_test
