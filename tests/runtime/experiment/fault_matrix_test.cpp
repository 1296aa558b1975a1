// Every (fault kind, mode) pair, table-driven on the small `ping` roles: supported pairs are
// carried out and leave their trace in the run's metrics; unsupported pairs are rejected when
// the experiment is read. One run per mode carries every fault that mode supports, at separate
// times and on separate targets, so that each row checks its own effect.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/yaml.hpp"
#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_fault_matrix_test {

using namespace starling;
using namespace starling::runtime;
using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

/// Three nodes of echo + pinger; each fault kind at its own time on its own target.
const char* base_yaml = R"(
experiment: {name: faults, kind: ping, seed: 3, duration: 14s}
caf:
  middleman: {heartbeat_interval: 250ms, connection_timeout: 1s}
network:
  defaults: {latency: 10ms, bandwidth: 10MB/s}
ping: {nodes: 3, payload: 1KB, interval: 100ms, timeout: 1500ms}
)";

std::string fault_line(const std::string& kind) {
  if (kind == "kill")
    return "  - {kill: pinger, instance: 1, at: 2s, restart_after: 2s}\n";
  if (kind == "kill_node")
    return "  - {kill_node: 2, at: 2.5s, restart_after: 3s}\n";
  if (kind == "preempt")
    return "  - {preempt: echo, every: 1s, restart_after: 500ms, at: 6s, until: 9.5s}\n";
  if (kind == "partition")
    return "  - {partition: [[0], [1]], at: 9s, until: 12s}\n";
  if (kind == "ban")
    return "  - {ban: 2, at: 12.5s, reason: sent a wrong gradient}\n";
  return "  - {slow_link: [0, 2], latency: 300ms, at: 9s, until: 12s}\n";
}

struct metrics {
  std::vector<metric_record> all;

  /// Records of `kind` from `source` (empty: any) within [from, to) seconds.
  std::vector<metric_record> of(const std::string& kind, const std::string& source, double from,
                                double to) const {
    std::vector<metric_record> out;
    for (auto& m : all)
      if (m.kind == kind && (source.empty() || m.source == source) && m.t >= from && m.t < to)
        out.push_back(m);
    return out;
  }
};

class capture_reporter : public reporter {
public:
  explicit capture_reporter(std::shared_ptr<metrics> out) : out_(std::move(out)) {}
  void on_metric(const metric_record& m) override { out_->all.push_back(m); }

private:
  std::shared_ptr<metrics> out_;
};

/// Successful pings from `pinger` to the echo of node `node` within [from, to).
size_t pings_to(const metrics& m, const std::string& pinger, size_t node, double from, double to) {
  size_t n = 0;
  for (auto& r : m.of("ping", pinger, from, to))
    if (r.label("target") == "@" + std::to_string(node) + "/echo." + std::to_string(node))
      n++;
  return n;
}

double max_rtt_to(const metrics& m, const std::string& pinger, size_t node, double from,
                  double to) {
  double worst = 0;
  for (auto& r : m.of("ping", pinger, from, to))
    if (r.label("target") == "@" + std::to_string(node) + "/echo." + std::to_string(node))
      worst = std::max(worst, r.value("rtt_ms"));
  return worst;
}

/// The effect each fault kind must leave (all three modes see the same plan).
void check_effect(const std::string& kind, const metrics& m) {
  CAPTURE(kind);
  if (kind == "kill") {
    auto kills = m.of("fault", "", 1.5, 2.6);
    REQUIRE(kills.size() >= 1);
    CHECK(kills[0].label("instance") == "pinger.1");
    CHECK(m.of("restart", "pinger.1", 3.5, 5.0).size() == 1);
    CHECK(m.of("ping", "pinger.1", 2.3, 3.8).empty()); // dead meanwhile
    CHECK(!m.of("ping", "pinger.1", 4.5, 14).empty());
  } else if (kind == "kill_node") {
    // Nobody reaches node 2 while it is down; its pinger is silent; it comes back.
    CHECK(pings_to(m, "pinger.0", 2, 2.8, 5.3) == 0);
    CHECK(m.of("ping", "pinger.2", 2.8, 5.3).empty());
    CHECK(pings_to(m, "pinger.0", 2, 8, 14) + pings_to(m, "pinger.1", 2, 8, 14) > 0);
  } else if (kind == "preempt") {
    auto preempted = m.of("fault", "", 6, 9.6);
    size_t echoes = 0;
    for (auto& f : preempted)
      echoes += f.label("instance").rfind("echo.", 0) == 0 ? 1 : 0;
    CHECK(echoes >= 1);
    // Every preempted echo comes back (a kill of one still down is a no-op).
    for (auto& f : preempted) {
      auto who = f.label("instance");
      CAPTURE(who);
      CHECK(!m.of("restart", who, f.t, f.t + 1.5).empty());
    }
  } else if (kind == "partition") {
    // Nodes 0 and 1 cannot reach each other while partitioned; node 2 reaches both.
    CHECK(pings_to(m, "pinger.0", 1, 9.7, 12) == 0);
    CHECK(pings_to(m, "pinger.1", 0, 9.7, 12) == 0);
    CHECK(pings_to(m, "pinger.0", 1, 12.8, 14) + pings_to(m, "pinger.1", 0, 12.8, 14) > 0);
  } else if (kind == "slow_link") {
    CHECK(max_rtt_to(m, "pinger.0", 2, 0.5, 2.9) < 200);
    CHECK(max_rtt_to(m, "pinger.0", 2, 9.2, 11.5) >= 600);
  } else if (kind == "ban") {
    // Node 2 is served until its ban, refused by every gate after it (both ways); 0 and 1
    // go on.
    CHECK(pings_to(m, "pinger.1", 2, 12, 12.5) > 0);
    CHECK(pings_to(m, "pinger.0", 2, 12.8, 14) == 0);
    CHECK(pings_to(m, "pinger.1", 2, 12.8, 14) == 0);
    CHECK(m.of("ping", "pinger.2", 12.8, 14).empty());
    CHECK(pings_to(m, "pinger.0", 1, 12.8, 14) > 0);
    CHECK(m.of("fault", "", 12.4, 12.6).size() == 1);
  }
}

struct row {
  std::string kind;
  run_mode mode;
  bool supported;
};

const std::vector<row> table{
  {"kill", run_mode::sim, true},          {"kill_node", run_mode::sim, true},
  {"preempt", run_mode::sim, true},       {"partition", run_mode::sim, true},
  {"slow_link", run_mode::sim, true},     {"ban", run_mode::sim, true},
  {"kill", run_mode::local, true},
  {"kill_node", run_mode::local, true},   {"preempt", run_mode::local, true},
  {"partition", run_mode::local, false},  {"slow_link", run_mode::local, false},
  {"kill", run_mode::cluster, true},      {"kill_node", run_mode::cluster, true},
  {"preempt", run_mode::cluster, true},   {"partition", run_mode::cluster, true},
  {"slow_link", run_mode::cluster, false}, {"ban", run_mode::local, false},
  {"ban", run_mode::cluster, false},
};

std::string yaml_for(run_mode mode, const std::vector<std::string>& kinds) {
  std::string y = base_yaml;
  y += "faults:\n";
  for (auto& k : kinds)
    y += fault_line(k);
  (void)mode;
  return y;
}

loaded_experiment read(const std::string& yaml, run_mode mode) {
  graph_load_options lo;
  lo.mode = mode;
  return read_experiment(load_yaml_string(yaml, "faults.yaml"), builtin_registry(), lo);
}

/// Runs the graph in this process and returns every metric.
metrics run_here(const std::string& yaml, run_mode mode) {
  auto ex = read(yaml, mode);
  auto out = std::make_shared<metrics>();
  ex.graph.reporters.push_back([out] { return std::make_unique<capture_reporter>(out); });
  run_settings s;
  auto r = run_in_process(ex.graph, builtin_registry(), mode, s);
  CHECK(r.exit_code == 0);
  return *out;
}

/// Runs the graph as 3 `starling node` processes and reads node 0's metrics (the others
/// forward theirs to it).
metrics run_cluster(const std::string& yaml) {
  char tmpl[] = "/tmp/starling-faults-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  auto config = dir + "/faults.yaml";
  std::ofstream{config} << yaml;
  auto nodes = starling::testing::start_nodes(3, [&](int i) {
    return std::vector<std::string>{STARLING_BINARY, "node", "--listen", "127.0.0.1:0",
                                    "--config", config, "--index", std::to_string(i), "--nodes",
                                    "3", "--out", dir + "/n" + std::to_string(i)};
  });
  REQUIRE(nodes.size() == 3);
  for (auto& n : nodes)
    CHECK(n->wait_exit(60s) == 0);
  metrics m;
  std::ifstream in{dir + "/n0/metrics.jsonl"};
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    metric_record r;
    r.t = j.value("t", 0.0);
    r.source = j.value("source", "");
    r.kind = j.value("event", "");
    for (auto& [k, v] : j.items()) {
      if (k == "t" || k == "node" || k == "source" || k == "event")
        continue;
      if (v.is_number())
        r.values[k] = v.get<double>();
      else if (v.is_string())
        r.labels[k] = v.get<std::string>();
    }
    m.all.push_back(std::move(r));
  }
  std::filesystem::remove_all(dir);
  return m;
}

} // namespace

TEST_CASE("every (fault kind, mode) pair is carried out or rejected when the file is read") {
  for (auto mode : {run_mode::sim, run_mode::local, run_mode::cluster}) {
    std::vector<std::string> kinds;
    for (auto& r : table) {
      if (r.mode != mode)
        continue;
      if (r.supported) {
        kinds.push_back(r.kind);
        continue;
      }
      // Unsupported: one clear error naming the kind and the mode, before anything runs.
      CAPTURE(r.kind);
      std::string mode_name = to_string(mode);
      CAPTURE(mode_name);
      try {
        read(yaml_for(mode, {r.kind}), mode);
        FAIL("accepted an unsupported fault");
      } catch (const config_error& e) {
        std::string what = e.what();
        CHECK(what.find("'" + r.kind + "'") != std::string::npos);
        CHECK(what.find(std::string{"not supported in "} + to_string(mode) + " mode")
              != std::string::npos);
      }
    }
    auto yaml = yaml_for(mode, kinds);
    auto m = mode == run_mode::cluster ? run_cluster(yaml) : run_here(yaml, mode);
    for (auto& k : kinds) {
      std::string mode_name = to_string(mode);
      CAPTURE(mode_name);
      check_effect(k, m);
    }
  }
}

TEST_CASE("the simulation of the fault matrix replays exactly for a seed") {
  auto yaml =
    yaml_for(run_mode::sim, {"kill", "kill_node", "preempt", "partition", "slow_link", "ban"});
  auto digest = [&] {
    auto ex = read(yaml, run_mode::sim);
    run_settings s;
    return run_in_process(ex.graph, builtin_registry(), run_mode::sim, s).trace_digest;
  };
  auto a = digest();
  CHECK(a != 0);
  CHECK(a == digest());
}

} // namespace starling::test::runtime_fault_matrix_test
