#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "runtime/config/config.hpp"

using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// Parses `text` and returns the error message (empty if it parsed).
std::string error_of(const std::string& text, const std::vector<std::string>& kinds = {}) {
  try {
    parse_experiment(load_yaml_string(text, "configs/x.yaml"), kinds);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

const std::vector<std::string> kinds{"masha", "ping", "swarm"};

/// A file under the temporary folder holding `text`, removed with the object.
struct temp_file {
  explicit temp_file(const std::string& name, const std::string& text)
    : path((std::filesystem::temp_directory_path()
            / ("starling-config-test-" + std::to_string(getpid()) + "-" + name))
             .string()) {
    std::ofstream{path} << text;
  }
  ~temp_file() { std::filesystem::remove(path); }
  std::string path;
};

std::string slurp(const std::string& path) {
  std::ifstream in{path};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

TEST_CASE("a valid experiment file loads with typed values and defaults") {
  auto cfg = parse_experiment(load_yaml_string(R"(
experiment:
  name: demo
  kind: ping
  seed: 7
  mode: sim
  duration: 1.5min
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
  preemptions_per_hour: 3
  restart_delay: 10s
  schedule:
    - {at: 20s, action: kill_node, target: b, restart_after: never}
    - {at: 30s, action: partition, target: a, peer: c}
ping:
  anything: 1
)",
                                                 "demo.yaml"));
  CHECK(cfg.experiment.name == "demo");
  CHECK(cfg.experiment.seed == 7);
  CHECK(cfg.experiment.mode == "sim");
  CHECK(cfg.experiment.duration == 90s);
  CHECK(cfg.caf.scheduler_policy == "sharing");
  CHECK(cfg.caf.max_threads == 3);
  CHECK(cfg.caf.heartbeat_interval == 250ms);
  CHECK(cfg.caf.connection_timeout == 2s);
  CHECK(cfg.node.join.size() == 1);
  CHECK(cfg.network.defaults.latency == 50ms);
  CHECK(cfg.network.defaults.bandwidth == doctest::Approx(10e6));
  REQUIRE(cfg.network.links.size() == 1);
  CHECK(cfg.network.links[0].link.bandwidth == doctest::Approx(25e6));
  CHECK(cfg.network.links[0].link.latency == 50ms); // inherited from the defaults
  CHECK(cfg.faults.preemptions_per_hour == doctest::Approx(3.0));
  REQUIRE(cfg.faults.schedule.size() == 2);
  CHECK(cfg.faults.schedule[0].restart_after.count() == -2);
  CHECK(cfg.faults.schedule[1].peer == "c");
  REQUIRE(cfg.workload.has_value());
  CHECK(cfg.workload->path() == "ping");
}

TEST_CASE("defaults apply when a section is absent") {
  auto cfg = parse_experiment(load_yaml_string("experiment: {name: x}\n", "x.yaml"));
  CHECK(cfg.caf.heartbeat_interval == 1s);
  CHECK(cfg.caf.connection_timeout == 5s);
  CHECK(cfg.node.listen == "127.0.0.1:0");
  CHECK_FALSE(cfg.workload.has_value());
}

TEST_CASE("an unknown key names its path and line") {
  auto e = error_of("experiment:\n  name: x\n  sede: 3\n");
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
  auto f = error_of("experiment: {name: x}\nfaults:\n  schedule:\n    - {action: kill_node}\n");
  CHECK(f.find("configs/x.yaml:4: faults.schedule[0]: missing required key 'at'") == 0);
  auto k = error_of("experiment: {name: x, kind: swarm}\n");
  CHECK(k.find("kind 'swarm' needs a section 'swarm'") != std::string::npos);
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

TEST_CASE("every file under configs/ loads") {
  int files = 0;
  for (auto& entry : std::filesystem::directory_iterator{STARLING_SOURCE_DIR "/configs"}) {
    if (entry.path().extension() != ".yaml")
      continue;
    ++files;
    auto path = entry.path().string();
    auto cfg = load_experiment(path);
    INFO(path);
    CHECK_MESSAGE(cfg.ok(), (cfg.ok() ? std::string{} : cfg.error().what));
  }
  CHECK(files >= 2);
}

TEST_CASE("a misspelt top-level section is reported before errors in other sections") {
  CHECK(error_of("experiment: {name: x, kind: ping}\npnig: {nodes: 2}\n")
        == "configs/x.yaml:2: pnig: unknown key (allowed here: caf, experiment, faults, network, "
           "node, ping)");
  CHECK(error_of("experiment: {name: x}\ncaf:\n  scheduler: {max_threads: two}\nnetwrok: {}\n")
        == "configs/x.yaml:4: netwrok: unknown key (allowed here: caf, experiment, faults, "
           "network, node)");
  // With the kinds known, a misspelt `experiment:` is unknown rather than missing.
  CHECK(error_of("experimnet: {name: x, kind: ping}\nping: {}\n", kinds)
        == "configs/x.yaml:1: experimnet: unknown key (allowed here: caf, experiment, faults, "
           "masha, network, node, ping, swarm)");
}

TEST_CASE("an unknown kind and a kind section without a kind are named") {
  CHECK(error_of("experiment: {name: x, kind: swram}\nswarm: {}\n", kinds)
        == "configs/x.yaml:1: experiment.kind: expected a known kind (masha, ping, swarm), got "
           "\"swram\"");
  CHECK(error_of("experiment: {name: x}\nping: {nodes: 2}\n", kinds)
        == "configs/x.yaml:2: ping: a 'ping' section needs 'kind: ping' in the experiment "
           "section");
  // Without the list of kinds, the section of another kind is simply unknown.
  CHECK(error_of("experiment: {name: x, kind: ping}\nping: {}\nswarm: {}\n").find(
          "configs/x.yaml:3: swarm: unknown key")
        == 0);
}

TEST_CASE("a misspelt key in a list item wins over the required key it hides") {
  auto f = error_of("experiment: {name: x}\nfaults:\n  schedule:\n"
                    "    - {at: 1s, action: kill_node, targte: a}\n");
  CHECK(f == "configs/x.yaml:4: faults.schedule[0].targte: unknown key (allowed here: action, at, "
             "peer, restart_after, target)");
  auto l = error_of("experiment: {name: x}\nnetwork:\n  links:\n    - {form: a, to: b}\n");
  CHECK(l == "configs/x.yaml:4: network.links[0].form: unknown key (allowed here: bandwidth, "
             "from, latency, loss, to)");
}

TEST_CASE("load_experiment applies --set overrides before it validates") {
  temp_file f{"set.yaml", "experiment:\n  name: x\n  kind: ping\n  duration: 60s\nping: {}\n"};
  auto cfg = load_experiment(f.path, {{"experiment.duration=20s", "experiment.seed=7"}, kinds});
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? std::string{} : cfg.error().what));
  CHECK(cfg->experiment.duration == 20s);
  CHECK(cfg->experiment.seed == 7);
  auto typo = load_experiment(f.path, {{"experiment.sede=7"}, kinds});
  REQUIRE_FALSE(typo.ok());
  CHECK(typo.error().what
        == "--set experiment.sede=7: unknown key (allowed here: duration, kind, log_level, mode, "
           "name, seed)");
  auto bad = load_experiment(f.path, {{"experiment.duration=soon"}, kinds});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().what.find("--set experiment.duration=soon: expected a duration") == 0);
  auto syntax = load_experiment(f.path, {{"experiment.duration"}, kinds});
  REQUIRE_FALSE(syntax.ok());
  CHECK(syntax.error().what.find("--set: expected KEY.PATH=VALUE") == 0);
}

TEST_CASE("a key given twice in an experiment file is an error naming both lines") {
  temp_file f{"twice.yaml", "experiment:\n  name: x\n  seed: 1\n  seed: 2\n"};
  auto cfg = load_experiment(f.path);
  REQUIRE_FALSE(cfg.ok());
  CHECK(cfg.error().what == f.path + ":4: experiment.seed: given twice (first at line 3)");
}

TEST_CASE("save_experiment copies the file, or writes the overridden tree with the --set list") {
  temp_file f{"save.yaml", "# a comment\nexperiment: {name: x, seed: 1}\n"};
  temp_file copy{"save-copy.yaml", ""};
  auto cfg = load_experiment(f.path);
  REQUIRE(cfg.ok());
  REQUIRE(save_experiment(f.path, *cfg, {}, copy.path));
  CHECK(slurp(copy.path) == slurp(f.path));
  auto set = load_experiment(f.path, {{"experiment.seed=9"}, {}});
  REQUIRE(set.ok());
  REQUIRE(save_experiment(f.path, *set, {"experiment.seed=9"}, copy.path));
  auto text = slurp(copy.path);
  CHECK(text.find("# " + f.path + " --set experiment.seed=9\n") == 0);
  auto again = load_experiment(copy.path);
  REQUIRE(again.ok());
  CHECK(again->experiment.seed == 9);
  CHECK(again->experiment.name == "x");
}
