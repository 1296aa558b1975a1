#include <doctest/doctest.h>

#include <string>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/yaml.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_masha_adversarial_config_test {

using namespace starling::runtime;

namespace {

/// Reads a masha-adversarial section with `body`; returns the error message (empty if valid).
std::string section_error(const std::string& body) {
  try {
    read_experiment(load_yaml_string("experiment: {name: x, kind: masha-adversarial}\n"
                                     "masha-adversarial:\n  data: synthetic\n" + body,
                                     "x.yaml"),
                    builtin_registry(), {});
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("configs/masha-adversarial.yaml is valid, bad masha-adversarial options are rejected") {
  auto cfg = load_experiment_file(STARLING_SOURCE_DIR + "/configs/masha-adversarial.yaml",
                                  builtin_registry(), {});
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().what));
  CHECK(cfg->graph.kind == "masha-adversarial");
  REQUIRE(cfg->graph.find("worker"));
  CHECK(cfg->graph.find("worker")->replicas == 10);
  CHECK(cfg->graph.study);

  CHECK(section_error("  epsilon: 0.2\n").empty());
  CHECK(has(section_error("  epsilon: 2\n"), "masha-adversarial.epsilon: expected a number in [0, 1]"));
  CHECK(has(section_error("  methods: [masha3]\n"), "one of extragradient, masha1, masha2"));
  CHECK(has(section_error("  methods: [masha1, masha1]\n"), "listed twice"));
  CHECK(has(section_error("  k: []\n"), "non-empty list"));
  CHECK(has(section_error("  k: [0]\n"), "fraction of dim(z) in (0, 1]"));
  CHECK(has(section_error("  workers: 10\n  train_per_worker: 7000\n"), "at most 60000"));
  CHECK(has(section_error("  timeout: 0s\n"), "positive duration"));
  CHECK(has(section_error("  budget_eg_iterations: 0\n"), "budget_eg_iterations"));
  CHECK(has(section_error("  bogus: 1\n"), "bogus: unknown key"));
}

} // namespace starling::test::runtime_masha_adversarial_config_test
