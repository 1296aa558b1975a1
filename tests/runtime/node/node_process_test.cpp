#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_node_process_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

/// Writes a config with fast failure detection (heartbeat 100 ms, connection timeout 1 s).
std::string fast_config() {
  auto path = std::filesystem::temp_directory_path()
              / fmt::format("starling-node-test-{}.yaml", getpid());
  std::ofstream out{path};
  out << "experiment: {name: node-test}\n"
         "caf:\n"
         "  middleman: {heartbeat_interval: 100ms, connection_timeout: 1s}\n";
  return path.string();
}

std::string port_of(const std::string& listening_line) {
  return listening_line.substr(listening_line.rfind(':') + 1);
}

/// An empty folder of its own under the temporary directory, removed with everything in it.
struct scratch_dir {
  explicit scratch_dir(const std::string& name)
    : path(std::filesystem::temp_directory_path()
           / fmt::format("starling-cli-test-{}-{}", getpid(), name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() { std::filesystem::remove_all(path); }
  /// Writes `text` to `name` inside the folder; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    auto file = (path / name).string();
    std::ofstream{file} << text;
    return file;
  }
  /// True when the folder holds nothing but the files `write` put there.
  bool holds_only(const std::vector<std::string>& names) const {
    size_t n = 0;
    for (auto& entry : std::filesystem::directory_iterator{path}) {
      ++n;
      if (std::find(names.begin(), names.end(), entry.path().filename().string()) == names.end())
        return false;
    }
    return n == names.size();
  }
  std::filesystem::path path;
};

/// What one `starling` command did: its exit code and its whole output (stdout + stderr).
struct outcome {
  int rc = -1;
  std::string output;
};

/// Runs `starling ARGS` with `cwd` as working directory (where `runs/` would appear).
outcome starling_in(const std::filesystem::path& cwd, const std::vector<std::string>& args) {
  auto cmd = fmt::format("cd '{}' && exec '{}'", cwd.string(), STARLING_BINARY);
  for (auto& a : args)
    cmd += fmt::format(" '{}'", a);
  subprocess p{{"/bin/sh", "-c", cmd}};
  auto rc = p.wait_exit(60s);
  return {rc ? *rc : -1, p.output()};
}

/// A ping experiment (cheap to validate, and to run in simulation) with `extra` lines appended.
std::string ping_yaml(const std::string& extra = "") {
  return "experiment: {name: strict, kind: ping, seed: 1, mode: sim, duration: 2s}\n"
         "ping: {nodes: 2, payload: 1KB, interval: 500ms, timeout: 1s}\n"
         + extra;
}

/// A swarm experiment: stages on lines 5-6, trainers on line 7.
std::string swarm_yaml(const std::string& stage0 = "{peers: [1.0]}",
                       const std::string& extra = "") {
  return "experiment: {name: strict, kind: swarm, duration: 5s}\n"
         "swarm:\n"
         "  model: {layers: 2, width: 16, heads: 2, seq_len: 8}\n"
         "  stages:\n"
         "    - " + stage0 + "\n"
         "    - {peers: [1.0]}\n"
         "  trainers: 1\n"
         + extra;
}

} // namespace

TEST_CASE("two starling node processes ping, and a SIGKILLed one is reported dead") {
  auto cfg = fast_config();
  subprocess a{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", cfg, "--name",
                "a"}};
  auto la = a.wait_for("listening on", 30s);
  REQUIRE(la);
  auto port = port_of(*la);
  subprocess b{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--join",
                "127.0.0.1:" + port, "--config", cfg, "--name", "b"}};
  auto pong = b.wait_for("ping 127.0.0.1:" + port, 30s);
  REQUIRE(pong);
  CHECK(pong->find("reply from a") != std::string::npos);
  a.signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto down = b.wait_for("down", 30s);
  auto detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(down);
  CHECK(down->find("peer 127.0.0.1:" + port) != std::string::npos);
  MESSAGE("dead peer reported after " << detected << " s (connection timeout 1 s)");
  b.signal(SIGTERM);
  auto t1 = std::chrono::steady_clock::now();
  auto rc = b.wait_exit(30s);
  auto stopped = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  REQUIRE(rc);
  CHECK(*rc == 0);
  MESSAGE("SIGTERM to exit: " << stopped << " s");
  std::filesystem::remove(cfg);
}

TEST_CASE("a starling node stops cleanly on SIGINT") {
  subprocess a{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--name", "a"}};
  REQUIRE(a.wait_for("listening on", 30s));
  a.signal(SIGINT);
  auto rc = a.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(a.output().find("shutting down (SIGINT)") != std::string::npos);
}

TEST_CASE("the CLI rejects bad input with one clear line and a non-zero exit") {
  subprocess bad_listen{{STARLING_BINARY, "node", "--listen", "127.0.0.1:99999"}};
  auto rc = bad_listen.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 2);
  CHECK(bad_listen.output().find("starling: error: --listen: expected a port") == 0);
  subprocess no_file{{STARLING_BINARY, "run", "/nonexistent.yaml"}};
  rc = no_file.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 2);
  CHECK(no_file.output() == "starling: error: /nonexistent.yaml: cannot open the file\n");
  subprocess no_cmd{{STARLING_BINARY}};
  rc = no_cmd.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc != 0);
}

TEST_CASE("starling run rejects each strictness case with one line, exit 2, and creates nothing") {
  scratch_dir dir{"run"};
  auto out = (dir.path / "out").string();
  struct bad_case {
    const char* what;
    std::string yaml;
    std::vector<std::string> extra_args;
    std::string line; // after "starling: error: <file>"
  };
  std::vector<bad_case> cases{
    {"a key given twice", swarm_yaml("{peers: [1.0]}", "  trainers: 3\n"), {},
     ":8: swarm.trainers: given twice (first at line 7)"},
    {"a misspelt key inside a stage", swarm_yaml("{peerz: [1.0]}"), {},
     ":5: swarm.stages[0].peerz: unknown key (allowed here: layers, peers)"},
    {"a misspelt top-level section",
     ping_yaml("netwrok: {defaults: {latency: 1ms}}\nfaults: {restart_delay: soon}\n"), {},
     ":3: netwrok: unknown key (allowed here: caf, events, experiment, faults, network, node, "
     "ping, placement, roles)"},
    {"an error in the kind's own section",
     "experiment: {name: strict, kind: ping, mode: sim}\nping: {nodes: 1}\n", {},
     ":2: ping.nodes: expected an integer in [2, 10000], got \"1\""},
    {"a fault kind the mode does not support",
     "experiment: {name: strict, kind: ping}\nping: {nodes: 2}\n"
     "faults: [{slow_link: [0, 1], latency: 1s, at: 1s}]\n",
     {}, ":3: faults[0]: fault kind 'slow_link' is not supported in local mode"},
    {"a misspelt key in the swarm's sim section",
     swarm_yaml("{peers: [1.0]}", "  sim: {forward_per_sampel: 1ms}\n"), {},
     ":8: swarm.sim.forward_per_sampel: unknown key"},
  };
  for (auto& c : cases) {
    INFO(c.what);
    auto file = dir.write("x.yaml", c.yaml);
    for (bool with_out : {false, true}) {
      std::vector<std::string> args{"run", file};
      if (with_out) {
        args.push_back("--out");
        args.push_back(out);
      }
      args.insert(args.end(), c.extra_args.begin(), c.extra_args.end());
      auto r = starling_in(dir.path, args);
      CHECK(r.rc == 2);
      CHECK(r.output.find("starling: error: " + file + c.line) == 0);
      CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
      CHECK(dir.holds_only({"x.yaml"})); // no runs/ folder, no --out folder
    }
  }
}

TEST_CASE("starling run --set overrides values, a bad --set is one line, exit 2, nothing made") {
  scratch_dir dir{"set"};
  auto file = dir.write("x.yaml", swarm_yaml());
  struct bad_case {
    std::string arg;
    std::string output;
  };
  std::vector<bad_case> cases{
    {"swarm.trainers", "starling: error: --set: expected KEY.PATH=VALUE (e.g. swarm.trainers=3 "
                       "or swarm.stages[1].peers[0]=0.5), got \"swarm.trainers\"\n"},
    {"swarm.trainerz=3", "starling: error: --set swarm.trainerz=3: unknown key (allowed here: "
                         "averaging, backward_first, checkpoint, compression, data, eval_batches, "
                         "export, hop_timeout, local_batch, max_inflight, microbatch, "
                         "microbatches_per_trainer, model, optimizer, preempt_every, "
                         "rebalance, restart_delay, sim, stages, target_batch, torch_threads, "
                         "trainers, volunteers)\n"},
    {"swarm.stages[1].peers[0]=1.5", "starling: error: --set swarm.stages[1].peers[0]=1.5: "
                                     "expected a speed in (0, 1], got \"1.5\"\n"},
    {"swarm.stages[2].peers[0]=1", "starling: error: --set swarm.stages[2].peers[0]=1: "
                                   "swarm.stages has 2 items, so no [2]\n"},
    {"experiment.duration=soon", "starling: error: --set experiment.duration=soon: expected a "
                                 "duration such as 250ms, 2s, 1.5min or 1h, got \"soon\"\n"},
  };
  for (auto& c : cases) {
    INFO(c.arg);
    auto r = starling_in(dir.path, {"run", file, "--set", c.arg});
    CHECK(r.rc == 2);
    CHECK(r.output == c.output);
    CHECK(dir.holds_only({"x.yaml"}));
  }
  // A good run: two overrides (one of them a new key) reach the run and its saved experiment.
  auto ping = dir.write("ping.yaml", ping_yaml());
  auto out = (dir.path / "out").string();
  auto r = starling_in(dir.path, {"run", ping, "--out", out, "--set", "experiment.duration=1s",
                                  "--set", "ping.timeout=400ms"});
  CHECK(r.rc == 0);
  CHECK(r.output.find("running 'strict'") != std::string::npos);
  std::ifstream saved{out + "/experiment.yaml"};
  std::string first_line;
  std::getline(saved, first_line);
  CHECK(first_line == "# " + ping + " --set experiment.duration=1s --set ping.timeout=400ms");
  CHECK_FALSE(std::filesystem::exists(dir.path / "runs"));
}

TEST_CASE("starling node validates --config and --set before it starts or creates anything") {
  scratch_dir dir{"node"};
  auto out = (dir.path / "out").string();
  auto file = dir.write("x.yaml", swarm_yaml("{peerz: [1.0]}"));
  auto r = starling_in(dir.path, {"node", "--config", file, "--index", "0", "--nodes", "1",
                                  "--out", out});
  CHECK(r.rc == 2);
  CHECK(r.output == "starling: error: " + file
                      + ":5: swarm.stages[0].peerz: unknown key (allowed here: layers, peers)\n");
  auto good = dir.write("good.yaml", swarm_yaml());
  r = starling_in(dir.path, {"node", "--config", good, "--index", "0", "--nodes", "1", "--out",
                             out, "--set", "swarm.trainers=0"});
  CHECK(r.rc == 2);
  CHECK(r.output == "starling: error: --set swarm.trainers=0: expected an integer in [1, 1024], "
                    "got \"0\"\n");
  r = starling_in(dir.path, {"node", "--set", "swarm.trainers=2"});
  CHECK(r.rc == 2);
  CHECK(r.output == "starling: error: --set needs --config EXPERIMENT.yaml\n");
  CHECK(dir.holds_only({"x.yaml", "good.yaml"}));
}

} // namespace starling::test::runtime_node_process_test
