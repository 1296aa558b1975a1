// Config strictness across every kind: the whole file, each kind's section included, is read
// as its run will read it.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/yaml.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_strictness_test {

using namespace starling::runtime;

namespace {

/// Reads `text` as `x.yaml` (in simulation mode when `simulate`); the error (empty when valid).
std::string validate_error(const std::string& text, bool simulate = false) {
  try {
    graph_load_options lo;
    if (simulate)
      lo.mode = run_mode::sim;
    read_experiment(load_yaml_string(text, "x.yaml"), builtin_registry(), lo);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

const std::string swarm_head = "experiment: {name: x, kind: swarm}\n"
                               "swarm:\n"
                               "  model: {layers: 2, width: 16, heads: 2, seq_len: 8}\n";

} // namespace

TEST_CASE("every file under configs/ validates, its kind's section included") {
  int files = 0;
  for (auto& entry : std::filesystem::directory_iterator{STARLING_SOURCE_DIR + "/configs"}) {
    // The reference holds every kind's section at once: reference_test.cpp reads it per kind.
    if (entry.path().extension() != ".yaml" || entry.path().filename() == "reference.yaml")
      continue;
    ++files;
    auto path = entry.path().string();
    INFO(path);
    auto ex = load_experiment_file(path, builtin_registry(), {}); // in the file's own mode
    CHECK_MESSAGE(ex.ok(), (ex.ok() ? std::string{} : ex.error().what));
  }
  CHECK(files >= 5);
}

TEST_CASE("a misspelt key in a stage's map is reported as unknown, not as a wrong type") {
  CHECK(validate_error(swarm_head + "  stages:\n    - {peerz: [1.0]}\n")
        == "x.yaml:5: swarm.stages[0].peerz: unknown key (allowed here: layers, peers)");
  CHECK(validate_error(swarm_head + "  stages:\n    - peers: [1.0]\n      layrs: [0, 2]\n")
        == "x.yaml:6: swarm.stages[0].layrs: unknown key (allowed here: layers, peers)");
  CHECK(validate_error(swarm_head + "  stages:\n    - {layers: [0, 2]}\n")
        == "x.yaml:5: swarm.stages[0]: missing required key 'peers' (the speed of each peer: "
           "peers: [1.0, 0.5])");
  CHECK(validate_error(swarm_head + "  stages:\n    - [1.0]\n")
        .find("x.yaml:5: swarm.stages[0]: expected a map {peers: [speed, ...]}")
        == 0);
}

TEST_CASE("a misspelt key of the swarm section wins over the errors its absence causes") {
  // `stages` misspelt: reported as unknown, not as a missing `stages`.
  CHECK(validate_error(swarm_head + "  stagse:\n    - {peers: [1.0]}\n")
          .find("x.yaml:4: swarm.stagse: unknown key (allowed here: averaging, backward_first, "
                "checkpoint, compression,")
        == 0);
  // `model` misspelt: reported as unknown, not as 3 stages against the default model's layers.
  CHECK(validate_error("experiment: {name: x, kind: swarm}\nswarm:\n  modle: {layers: 3}\n"
                       "  stages: [{peers: [1.0]}, {peers: [1.0]}, {peers: [1.0]}]\n")
          .find("x.yaml:3: swarm.modle: unknown key")
        == 0);
}

TEST_CASE("the swarm's checkpoint section is read strictly") {
  auto text = swarm_head + "  stages: [{peers: [1.0]}]\n  checkpoint: {evry: 1s}\n";
  CHECK(validate_error(text).find("x.yaml:5: swarm.checkpoint.evry: unknown key") == 0);
  auto keep = swarm_head + "  stages: [{peers: [1.0]}]\n  checkpoint: {every: 1s, keep: 0}\n";
  CHECK(validate_error(keep).find("x.yaml:5: swarm.checkpoint.keep") == 0);
}

TEST_CASE("the swarm's sim section is read strictly in every mode") {
  auto text = swarm_head + "  stages: [{peers: [1.0]}]\n  sim:\n    forward_per_sampel: 1ms\n";
  CHECK(validate_error(text, true).find("x.yaml:6: swarm.sim.forward_per_sampel: unknown key")
        == 0);
  CHECK(validate_error(text, false).find("x.yaml:6: swarm.sim.forward_per_sampel: unknown key")
        == 0);
  CHECK(validate_error(swarm_head + "  stages: [{peers: [1.0]}]\n  sim: {noise: 0.1}\n").empty());
}

TEST_CASE("each kind's validate rejects a bad value in its own section") {
  CHECK(validate_error("experiment: {name: x, kind: ping}\nping: {nodes: 1}\n")
        == "x.yaml:2: ping.nodes: expected an integer in [2, 10000], got \"1\"");
  CHECK(validate_error("experiment: {name: x, kind: ping}\nping: {nodez: 3}\n")
        .find("x.yaml:2: ping.nodez: unknown key (allowed here: interval, nodes, payload, timeout)")
        == 0);
  CHECK(validate_error("experiment: {name: x, kind: masha}\nmasha: {workers: 0}\n")
        .find("x.yaml:2: masha.workers: expected an integer in [1, 100000]")
        == 0);
  CHECK(validate_error("experiment: {name: x, kind: masha-adversarial}\n"
                       "masha-adversarial: {data: mnist}\n")
        .find("x.yaml:2: masha-adversarial.data: expected one of auto | fashion-mnist | synthetic")
        == 0);
  CHECK(validate_error(swarm_head + "  stages: [{peers: [1.0]}]\n  trainers: 0\n")
        == "x.yaml:5: swarm.trainers: expected an integer in [1, 1024], got \"0\"");
}

} // namespace starling::test::runtime_strictness_test
