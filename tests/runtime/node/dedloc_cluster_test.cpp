// The `dedloc` kind across processes: four `starling node` processes (one data-parallel peer
// each, the last in client mode) train one model together over loopback; one is SIGKILLed
// mid-run and the others go on; a newcomer process started later downloads the state from
// several full-mode peers and then averages with them; the run ends on node 0's word and every
// live process exits 0. What happened is read from node 0's metrics.jsonl (every peer's metrics
// reach it) and the processes' outputs, waited on with deadlines.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/node_fixtures.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_dedloc_cluster_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// Four peers of a 784-32-10 MLP (Fashion-MNIST, or synthetic images where it is absent), one
/// per node; peer 3 in client mode. Global steps of 512 samples, 1 s matchmaking windows, and
/// records that stop counting 6 s after their peer went silent. The duration is only a bound:
/// the test ends the run (SIGINT to node 0) once it has seen everything.
std::string write_config(const std::string& dir) {
  auto path = dir + "/dedloc-cluster.yaml";
  std::ofstream f{path};
  f << "experiment: {name: dedloc-cluster-test, kind: dedloc, seed: 11, duration: 3min}\n"
       "caf:\n"
       "  scheduler: {policy: sharing, max_threads: 2}\n"
       "  middleman: {heartbeat_interval: 500ms, connection_timeout: 2s}\n"
       "dedloc:\n"
       "  peers: 4\n"
       "  speeds: [1.0]\n"
       "  clients: 1\n"
       "  width: 32\n"
       "  microbatch: 16\n"
       "  target_batch: 512\n"
       "  compute_time: 40ms\n"
       "  window: 1s\n"
       "  averager_timeout: 5s\n"
       "  round_timeout: 8s\n"
       "  record_lifetime: 6s\n"
       "  eval_every: 0\n"
       "  eval_samples: 200\n"
       "  train_samples: 4000\n"
       "  synthetic: true\n";
  return path;
}

/// Node 0's metrics.jsonl, read as it grows (whole lines only).
struct metrics_log {
  std::string path;
  std::streamoff offset = 0;
  std::string partial;
  std::vector<nlohmann::json> rows;

  void poll() {
    std::ifstream in{path, std::ios::binary};
    if (!in)
      return;
    in.seekg(offset);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset += static_cast<std::streamoff>(chunk.size());
    partial += chunk;
    size_t start = 0;
    for (auto nl = partial.find('\n'); nl != std::string::npos; nl = partial.find('\n', start)) {
      auto line = partial.substr(start, nl - start);
      start = nl + 1;
      auto j = nlohmann::json::parse(line, nullptr, false);
      REQUIRE_MESSAGE(!j.is_discarded(), "metrics.jsonl holds a line that is not JSON: " << line);
      rows.push_back(std::move(j));
    }
    partial.erase(0, start);
  }

  /// The rows of `event` from `source` (any source if empty) at run time `after` or later.
  std::vector<const nlohmann::json*> of(const std::string& event, const std::string& source = "",
                                        double after = -1) const {
    std::vector<const nlohmann::json*> out;
    for (auto& r : rows)
      if (r.value("event", "") == event && (source.empty() || r.value("source", "") == source) &&
          r.value("t", -1.0) >= after)
        out.push_back(&r);
    return out;
  }

  /// The latest run time any row carries.
  double latest() const {
    double t = 0;
    for (auto& r : rows)
      t = std::max(t, r.value("t", 0.0));
    return t;
  }
};

/// Averaged updates of `source` from `after` on: `dp_step` rows whose round had partners (every
/// peer runs in a process of its own, so a group of 2 or more crosses processes).
size_t averaged_steps(const metrics_log& log, const std::string& source, double after = -1) {
  size_t n = 0;
  for (auto* r : log.of("dp_step", source, after))
    if ((*r)["averaged"].get<double>() > 0 && (*r)["group"].get<double>() >= 2)
      n++;
  return n;
}

const std::vector<std::string> survivors{"peers.0", "peers.1", "peers.3"};

} // namespace

TEST_CASE("dedloc across 4 starling node processes: peers average across processes, a client "
          "averages but serves no state, a SIGKILLed peer stops nobody, a newcomer downloads the "
          "state from several donors and averages, and the run ends normally") {
  auto began = clock_type::now();
  starling::testing::temp_dir dir{"starling-dedloc-cluster"};
  auto config = write_config(dir.path);
  auto argv_of = [&](int i, const std::string& out) {
    return std::vector<std::string>{STARLING_BINARY, "node", "--listen", "127.0.0.1:0",
                                    "--config",      config, "--index",  std::to_string(i),
                                    "--nodes",       "4",    "--out",    dir.path + "/" + out};
  };
  auto nodes =
      starling::testing::start_nodes(4, [&](int i) { return argv_of(i, "n" + std::to_string(i)); });
  REQUIRE(nodes.size() == 4);
  auto first = starling::testing::endpoint_of(nodes[0]->output());
  std::unique_ptr<subprocess> newcomer;
  metrics_log log{dir.path + "/n0/metrics.jsonl"};
  // Waits until `done` holds, reading node 0's log as it grows; every process's output is
  // drained meanwhile (node 0's pipe is also the tick: its next line, or 100 ms).
  auto wait_until = [&](const std::function<bool()>& done, std::chrono::seconds limit) {
    auto deadline = clock_type::now() + limit;
    for (;;) {
      log.poll();
      if (done())
        return true;
      if (clock_type::now() > deadline)
        return false;
      for (size_t i = 1; i < nodes.size(); ++i)
        while (nodes[i]->read_line(0ms)) {
        }
      if (newcomer)
        while (newcomer->read_line(0ms)) {
        }
      if (nodes[0]->wait_exit(0ms))
        return false; // node 0 ended: nothing more comes
      (void)nodes[0]->read_line(100ms);
    }
  };
  auto seconds_since = [](clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
  };

  // 1. Every peer averages with partners in other processes, the client-mode one included.
  auto all_averaging = [&] {
    for (auto& p : {"peers.0", "peers.1", "peers.2", "peers.3"})
      if (averaged_steps(log, p) < 3)
        return false;
    return true;
  };
  REQUIRE_MESSAGE(wait_until(all_averaging, 90s), "no averaging across processes; node 0:\n"
                                                      << nodes[0]->output());
  auto averaging_at = seconds_since(began);
  // One peer per process: every group of 2 or more crossed processes.
  for (auto& n : nodes)
    CHECK_MESSAGE(n->output().find(" of 4: 1 role instance(s)") != std::string::npos, n->output());
  std::map<std::string, std::string> modes;
  for (auto* r : log.of("dp_join"))
    modes[(*r)["source"].get<std::string>()] = (*r)["mode"].get<std::string>();
  CHECK(modes ==
        std::map<std::string, std::string>{
            {"peers.0", "full"}, {"peers.1", "full"}, {"peers.2", "full"}, {"peers.3", "client"}});

  // 2. SIGKILL of node 2 mid-run: the others keep completing averaged rounds.
  nodes[2]->signal(SIGKILL);
  auto killed_wall = clock_type::now();
  CHECK(nodes[2]->wait_exit(30s) == 128 + SIGKILL);
  auto killed_at = log.latest();
  auto survivors_go_on = [&] {
    for (auto& p : survivors)
      if (averaged_steps(log, p, killed_at) < 5)
        return false;
    return true;
  };
  REQUIRE_MESSAGE(wait_until(survivors_go_on, 60s),
                  "the survivors stopped averaging after the kill; node 0:\n"
                      << nodes[0]->output());
  auto recovered_s = seconds_since(killed_wall);
  CHECK(log.of("dp_step", "peers.2", killed_at + 0.5).empty());

  // 3. A newcomer process (node 2 again, a fresh peer with a new key) downloads the state from
  //    several full-mode peers and then averages with them.
  auto spawned = clock_type::now();
  auto spawned_at = log.latest(); // until the newcomer says better (below)
  auto newcomer_argv = argv_of(2, "n2-newcomer");
  newcomer_argv.insert(newcomer_argv.end(), {"--join", first});
  newcomer = std::make_unique<subprocess>(newcomer_argv);
  auto synced = newcomer->wait_for("run clock", 60s);
  REQUIRE_MESSAGE(synced, "the newcomer did not start:\n" << newcomer->output());
  auto synced_s = seconds_since(spawned);
  // `node2: run clock X s`: the run's clock when the newcomer had joined the DHT; its spawn
  // was `synced_s` earlier.
  auto clock_text = synced->substr(synced->find("run clock ") + 10);
  spawned_at = std::stod(clock_text) - synced_s;
  double joined_at = -1, downloaded_at = -1, contributed_at = -1;
  double donors = 0;
  auto newcomer_contributes = [&] {
    if (joined_at < 0)
      for (auto* r : log.of("dp_join", "peers.2", spawned_at))
        joined_at = (*r)["t"].get<double>();
    if (joined_at < 0)
      return false;
    if (downloaded_at < 0)
      for (auto* r : log.of("dp_download", "peers.2", joined_at))
        if ((*r)["ok"].get<double>() > 0 && (*r)["donors"].get<double>() >= 2) {
          downloaded_at = (*r)["t"].get<double>();
          donors = (*r)["donors"].get<double>();
          break;
        }
    if (downloaded_at < 0)
      return false;
    for (auto* r : log.of("dp_step", "peers.2", downloaded_at))
      if ((*r)["averaged"].get<double>() > 0 && (*r)["group"].get<double>() >= 2) {
        contributed_at = (*r)["t"].get<double>();
        return true;
      }
    return false;
  };
  REQUIRE_MESSAGE(wait_until(newcomer_contributes, 60s),
                  "the newcomer did not download from several donors and average (joined at "
                      << joined_at << " s, downloaded at " << downloaded_at << " s); node 0:\n"
                      << nodes[0]->output() << "\nnewcomer:\n"
                      << newcomer->output());
  CHECK(donors >= 2);

  // 4. The run ends on node 0's word: its summary, and every live process exits 0 by itself.
  nodes[0]->signal(SIGINT);
  CHECK(nodes[0]->wait_exit(60s) == 0);
  log.poll();
  for (int i : {1, 3}) {
    CHECK(nodes[i]->wait_exit(60s) == 0);
    CHECK(nodes[i]->output().find("stopping (the run is complete)") != std::string::npos);
  }
  CHECK(newcomer->wait_exit(60s) == 0);
  CHECK(newcomer->output().find("stopping (the run is complete)") != std::string::npos);
  CHECK(nodes[0]->output().find("dedloc summary") != std::string::npos);

  // Donors: full-mode peers served parts (the newcomer's downloads), the client never was asked.
  std::set<std::string> served;
  for (auto* r : log.of("dp_serve"))
    if ((*r)["ok"].get<double>() > 0)
      served.insert((*r)["source"].get<std::string>());
  CHECK(log.of("dp_serve", "peers.3").empty());
  CHECK(served.count("peers.0") + served.count("peers.1") >= 2);
  // No download failed, and nothing was lost silently: every dp_download says ok.
  for (auto* r : log.of("dp_download"))
    CHECK((*r)["ok"].get<double>() > 0);

  // Survivors' updates on their own gradient after the kill (a round the dead peer broke).
  size_t lone = 0;
  for (auto& p : survivors)
    for (auto* r : log.of("dp_step", p, killed_at))
      lone += (*r)["averaged"].get<double>() > 0 ? 0 : 1;
  std::string per_peer;
  for (auto& p : {"peers.0", "peers.1", "peers.2", "peers.3"})
    per_peer += fmt::format(" {}={}", p, averaged_steps(log, p));
  MESSAGE(fmt::format(
      "wall {:.1f} s; all 4 averaging after {:.1f} s; survivors 5 averaged rounds each {:.1f} s "
      "after the SIGKILL; newcomer: process start to run clock {:.1f} s, dp_join at +{:.2f} s, "
      "download ({} donors) at +{:.2f} s, first averaged step at +{:.2f} s (from its spawn); "
      "averaged rounds per peer:{} (peers.2: both processes); survivors' lone updates after "
    "the kill: {}",
      seconds_since(began), averaging_at, recovered_s, synced_s, joined_at - spawned_at, donors,
      downloaded_at - spawned_at, contributed_at - spawned_at, per_peer, lone));
}

} // namespace starling::test::runtime_dedloc_cluster_test
