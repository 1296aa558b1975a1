#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_swarm_cluster_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

/// The `HOST:PORT` from a `node NAME listening on HOST:PORT` line.
std::string endpoint_of(const std::string& line) {
  auto start = line.find("on ") + 3;
  return line.substr(start, line.find_first_of(" \n", start) - start);
}

/// A small swarm for 4 processes: 3 stages of 2 peers each (placed on 3 stage nodes so that each
/// stage's peers are on different nodes), one trainer on node 0, no injected preemptions (the
/// test kills a whole process instead). The peers of a stage average their gradients across
/// processes (DHT progress records, averager over BASP) every 64 samples.
std::string write_config(const std::string& dir) {
  auto path = dir + "/swarm-cluster.yaml";
  std::ofstream f{path};
  f << "experiment: {name: swarm-cluster-test, kind: swarm, seed: 7, duration: 4min}\n"
       "caf:\n"
       "  scheduler: {policy: sharing, max_threads: 2}\n"
       "  middleman: {heartbeat_interval: 500ms, connection_timeout: 2s}\n"
       "swarm:\n"
       "  model: {layers: 3, width: 32, heads: 2, seq_len: 32}\n"
       "  stages: [{peers: [1.0, 1.0]}, {peers: [1.0, 1.0]}, {peers: [1.0, 1.0]}]\n"
       "  trainers: 1\n"
       "  microbatch: 8\n"
       "  microbatches_per_trainer: 300\n"
       "  target_batch: 64\n"
       "  averaging: {progress_period: 250ms, matchmaking_window: 1s, round_timeout: 5s}\n"
       "  optimizer: {kind: adam, lr: 3e-3}\n"
       "  hop_timeout: 2s\n"
       "  preempt_every: 0s\n"
       "  eval_batches: 4\n";
  return path;
}

} // namespace

TEST_CASE("swarm across 4 starling node processes: SIGKILL of a stage process mid-run, training "
          "completes every requested sample, stage peers average gradients across processes and "
          "the loss falls") {
  char tmpl[] = "/tmp/starling-cluster-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  auto config = write_config(dir);
  std::vector<std::unique_ptr<subprocess>> nodes;
  std::string first;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> argv{STARLING_BINARY, "node",     "--listen",
                                  "127.0.0.1:0",   "--config", config,
                                  "--index",       std::to_string(i), "--nodes",
                                  "4",             "--out",    dir + "/n" + std::to_string(i),
                                  "--name",        "n" + std::to_string(i)};
    if (i > 0) {
      argv.push_back("--join");
      argv.push_back(first);
    }
    nodes.push_back(std::make_unique<subprocess>(argv));
    auto line = nodes.back()->wait_for("listening on", 60s);
    REQUIRE(line);
    if (i == 0)
      first = endpoint_of(*line);
  }
  // Mid-run: once node 0 reported 60 microbatches, kill node 2 (one peer of stages 0 and 1).
  std::regex progress{R"((\d+)/300 microbatches)"};
  bool killed = false;
  for (int lines = 0; lines < 1000 && !killed; ++lines) {
    auto line = nodes[0]->read_line(120s);
    REQUIRE(line);
    std::smatch m;
    if (std::regex_search(*line, m, progress) && std::stoi(m[1]) >= 60) {
      nodes[2]->signal(SIGKILL);
      killed = true;
    }
  }
  REQUIRE(killed);
  CHECK(nodes[2]->wait_exit(30s) == 128 + SIGKILL);
  auto samples = nodes[0]->wait_for("samples ", 240s);
  REQUIRE(samples);
  CHECK(samples->find("2400 of 2400 requested") != std::string::npos);
  // The stages' peers, on different processes, averaged their gradients.
  auto averaging = nodes[0]->wait_for("gradient averaging", 60s);
  REQUIRE(averaging);
  std::smatch am;
  REQUIRE(std::regex_search(*averaging, am, std::regex{R"((\d+) rounds of live peers: (\d+) averaged)"}));
  MESSAGE(*averaging);
  CHECK(std::stoi(am[2]) > 0);
  auto held_out = nodes[0]->wait_for("held-out loss (before -> after)", 60s);
  REQUIRE(held_out);
  std::smatch m;
  REQUIRE(std::regex_search(*held_out, m, std::regex{R"(([0-9.]+) -> ([0-9.]+))"}));
  CHECK(std::stod(m[2]) < std::stod(m[1]));
  CHECK(nodes[0]->wait_exit(60s) == 0);
  for (int i : {1, 3}) {
    nodes[i]->signal(SIGTERM);
    CHECK(nodes[i]->wait_exit(30s) == 0);
  }
  std::filesystem::remove_all(dir);
}

} // namespace starling::test::runtime_swarm_cluster_test
