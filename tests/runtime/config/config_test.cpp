#include <doctest/doctest.h>

#include <filesystem>

#include "runtime/config/config.hpp"
#include "runtime/experiment/yaml.hpp"

namespace starling::test::runtime_config_test {

using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// Reads a whole experiment from `text`.
loaded_experiment read_text(const std::string& text, const std::string& name = "configs/x.yaml") {
  return read_experiment(load_yaml_string(text, name), builtin_registry(), {});
}

/// Parses `text` and returns the error message (empty if it parsed).
std::string error_of(const std::string& text) {
  try {
    read_text(text);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

} // namespace

TEST_CASE("a valid experiment file loads with typed values and defaults") {
  auto ex = read_text(R"(
experiment:
  name: demo
  kind: ping
  seed: 7
  mode: sim
  duration: 1.5min
  nodes: 3
caf:
  scheduler: {policy: sharing, max_threads: 3}
  middleman: {heartbeat_interval: 250ms, connection_timeout: 2s}
node:
  listen: 127.0.0.1:0
  join: [127.0.0.1:4242]
network:
  defaults: {latency: 50ms, bandwidth: 10MB/s, loss: 0.01}
  links:
    - {from: a, to: b, bandwidth: 200mbit}
faults:
  - {kill_node: 1, at: 20s, restart_after: never}
  - {partition: [[0], [1, 2]], at: 30s, until: 40s}
  - {preempt: pinger, every: 10s}
ping:
  nodes: 3
)",
                      "demo.yaml");
  auto& g = ex.graph;
  CHECK(g.name == "demo");
  CHECK(g.seed == 7);
  CHECK(ex.mode == run_mode::sim);
  CHECK(g.duration == 90s);
  CHECK(g.caf.scheduler_policy == "sharing");
  CHECK(g.caf.max_threads == 3);
  CHECK(g.caf.heartbeat_interval == 250ms);
  CHECK(g.caf.connection_timeout == 2s);
  CHECK(g.node.join.size() == 1);
  CHECK(g.network.defaults.latency == 50ms);
  CHECK(g.network.defaults.bandwidth == doctest::Approx(10e6));
  REQUIRE(g.network.links.size() == 1);
  CHECK(g.network.links[0].link.bandwidth == doctest::Approx(25e6));
  CHECK(g.network.links[0].link.latency == 50ms); // inherited from the defaults
  REQUIRE(g.faults.size() == 3);
  CHECK(g.faults[0].kind == fault_kind::kill_node);
  CHECK(g.faults[0].restart.never);
  CHECK(g.faults[1].groups == std::vector<std::vector<size_t>>{{0}, {1, 2}});
  CHECK(g.faults[1].until == std::optional<std::chrono::nanoseconds>{40s});
  CHECK(g.faults[2].every == 10s);
  REQUIRE(g.roles.size() == 2);
  CHECK(g.roles[1].name == "pinger");
}

TEST_CASE("defaults apply when a section is absent") {
  auto ex = read_text("experiment: {name: x, kind: ping}\nping: {}\n");
  CHECK(ex.graph.caf.heartbeat_interval == 1s);
  CHECK(ex.graph.caf.connection_timeout == 5s);
  CHECK(ex.graph.node.listen == "127.0.0.1:0");
  CHECK(ex.mode == run_mode::local);
  CHECK(ex.graph.faults.empty());
}

TEST_CASE("an unknown key names its path and line") {
  auto e = error_of("experiment:\n  name: x\n  sede: 3\nroles: {}\n");
  CHECK(e.find("configs/x.yaml:3: experiment.sede: unknown key") == 0);
  auto top = error_of("experiment: {name: x}\nbogus: 1\n");
  CHECK(top.find("configs/x.yaml:2: bogus: unknown key") == 0);
}

TEST_CASE("a wrong type names the key path, the line and what was expected") {
  auto e = error_of("experiment:\n  name: x\ncaf:\n  scheduler:\n    max_threads: two\n");
  CHECK(e == "configs/x.yaml:5: caf.scheduler.max_threads: expected an integer in [1, 256], "
             "got \"two\"");
  auto d = error_of("experiment: {name: x, duration: soon}\n");
  CHECK(d.find("configs/x.yaml:1: experiment.duration: expected a duration") == 0);
  auto m = error_of("experiment: {name: x}\nnode: 5\n");
  CHECK(m.find("configs/x.yaml:2: node: expected a map") == 0);
}

TEST_CASE("out-of-range values are rejected") {
  auto e = error_of("experiment: {name: x}\nnetwork:\n  defaults: {loss: 1.5}\n");
  CHECK(e == "configs/x.yaml:3: network.defaults.loss: expected a number in [0, 1], got \"1.5\"");
  auto p = error_of("experiment: {name: x}\nnode: {listen: \"127.0.0.1:70000\"}\n");
  CHECK(p.find("configs/x.yaml:2: node.listen: expected HOST:PORT") == 0);
  auto c = error_of("experiment: {name: x, mode: turbo}\n");
  CHECK(c.find("expected one of local | sim | cluster, got \"turbo\"") != std::string::npos);
}

TEST_CASE("missing required keys and sections are named") {
  CHECK(error_of("caf: {}\n").find("missing required section 'experiment'") != std::string::npos);
  auto f = error_of("experiment: {name: x, kind: ping}\nping: {}\nfaults:\n  - {kill_node: 1}\n");
  CHECK(f.find("configs/x.yaml:4: faults[0]: missing required key 'at'") == 0);
  auto k = error_of("experiment: {name: x, kind: swarm}\n");
  CHECK(k.find("swarm") != std::string::npos);
  auto r = error_of("experiment: {name: x}\n");
  CHECK(r.find("missing `roles:`") != std::string::npos);
}

TEST_CASE("syntax errors carry the line") {
  auto e = error_of("experiment:\n  name: [unclosed\n");
  CHECK(e.find("configs/x.yaml:") == 0);
  CHECK(e.find("invalid YAML") != std::string::npos);
}

TEST_CASE("units parse strictly") {
  auto n = load_yaml_string("a: 64KiB\nb: 1Gbit/s\nc: 250us\nd: 1e3\n", "u.yaml");
  CHECK(n.child("a").as_bytes() == 65536);
  CHECK(n.child("b").as_bandwidth() == doctest::Approx(125e6));
  CHECK(n.child("c").as_duration() == 250us);
  CHECK(n.child("d").as_duration() == 1000s);
  CHECK_THROWS_AS(n.child("a").as_duration(), config_error);
}

TEST_CASE("node.congestion_control takes a kernel algorithm's name or system, and nothing else") {
  auto cc = [](const std::string& node) {
    return read_text("experiment: {name: x, kind: ping}\nping: {}\n" + node)
      .graph.node.congestion_control;
  };
  CHECK(cc("") == "cubic");
  CHECK(cc("node: {congestion_control: bbr}\n") == "bbr");
  CHECK(cc("node: {congestion_control: system}\n") == "system");
  for (auto bad : {"\"\"", "BBR", "\"cu bic\"", "a_name_too_long_16"}) {
    CAPTURE(bad);
    auto e = error_of(std::string{"experiment: {name: x}\nnode: {congestion_control: "} + bad
                      + "}\n");
    CHECK(e.find("configs/x.yaml:2: node.congestion_control: expected a TCP congestion "
                 "control's name") == 0);
  }
}

} // namespace starling::test::runtime_config_test
