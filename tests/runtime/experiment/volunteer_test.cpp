// Open slots: a `starling node` started without `--index` claims one through the DHT and runs
// it; the numbered nodes reach it as `@open/<role>.<i>` and its metrics reach node 0. Once every
// open slot is held, a volunteer runs one more instance of the open role, up to the file's
// `node.max_volunteers`; one beyond it is refused with one line (exit 2).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_volunteer_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

TEST_CASE("a node started without --index takes the open slot and joins the run") {
  char tmpl[] = "/tmp/starling-volunteer-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  auto config = dir + "/volunteer.yaml";
  std::ofstream{config} << R"(
experiment: {name: volunteers, seed: 5, duration: 15s}
node: {max_volunteers: 2}
roles:
  echo: {type: ping.echo, replicas: 2}
  pinger: {type: ping.pinger, replicas: 2, options: {payload: 1KB, interval: 200ms, timeout: 1s, targets: guest}}
  guest: {type: ping.echo, replicas: 1}
placement:
  pinger: {colocate: echo}
  guest: {open: true}
)";
  // The plan leaves the guest's slot open.
  subprocess plan{{STARLING_BINARY, "plan", config, "--mode", "cluster", "--nodes", "2"}};
  REQUIRE(plan.wait_exit(30s) == 0);
  CHECK(plan.output().find("open slots (taken by nodes started without --index): guest.0")
        != std::string::npos);
  auto nodes = starling::testing::start_nodes(2, [&](int i) {
    return std::vector<std::string>{STARLING_BINARY, "node", "--config", config, "--index",
                                    std::to_string(i), "--nodes", "2", "--out",
                                    dir + "/n" + std::to_string(i)};
  });
  REQUIRE(nodes.size() == 2);
  // Node 0's first line is the one with its endpoint.
  auto first = starling::testing::endpoint_of(nodes[0]->output());
  subprocess guest{{STARLING_BINARY, "node", "--config", config, "--nodes", "2", "--join", first,
                    "--out", dir + "/guest"}};
  CHECK(guest.wait_for("volunteer: holds slot guest.0", 30s));
  // Two more at once: one takes an instance beyond the plan (guest.1), the other finds the
  // run's two volunteers and is refused.
  std::vector<std::unique_ptr<subprocess>> more;
  for (auto* who : {"b", "c"})
    more.push_back(std::make_unique<subprocess>(std::vector<std::string>{
        STARLING_BINARY, "node", "--config", config, "--nodes", "2", "--join", first, "--out",
        dir + "/guest-" + who}));
  int extra = 0, refused = 0;
  for (auto& m : more) {
    auto rc = m->wait_exit(60s);
    while (m->read_line(std::chrono::milliseconds(0))) {
    }
    INFO(m->output());
    REQUIRE(rc);
    if (*rc == 0 && m->output().find("holds slot guest.1 (every open slot of the plan was held") !=
                        std::string::npos)
      ++extra;
    if (*rc == 2 && m->output().find("takes at most 2 volunteer(s) at once and has 2 now") !=
                        std::string::npos)
      ++refused;
  }
  CHECK(extra == 1);
  CHECK(refused == 1);
  for (auto& n : nodes)
    CHECK(n->wait_exit(60s) == 0);
  CHECK(guest.wait_exit(60s) == 0);
  // The pingers reached the volunteer's echo.
  std::ifstream in{dir + "/n0/metrics.jsonl"};
  std::string line;
  int replies = 0;
  while (std::getline(in, line))
    if (line.find("\"event\":\"ping\"") != std::string::npos
        && line.find("@open/guest.0") != std::string::npos)
      replies++;
  CHECK(replies > 5);
  std::filesystem::remove_all(dir);
}

} // namespace starling::test::runtime_volunteer_test
