#include <doctest/doctest.h>

#include <string>

#include "runtime/config/config.hpp"
#include "runtime/run/masha_adversarial_workload.hpp"

using namespace starling::runtime;

namespace {

/// Reads a masha-adversarial section with `body`; returns the error message (empty if valid).
std::string section_error(const std::string& body) {
  try {
    auto cfg = parse_experiment(load_yaml_string(
      "experiment: {name: x, kind: masha-adversarial}\nmasha-adversarial:\n" + body, "x.yaml"));
    masha_adversarial_options o;
    auto s = *cfg.workload;
    read_options(s, o);
    s.finish();
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("configs/masha-adversarial.yaml is valid; bad masha-adversarial options are rejected") {
  auto cfg = load_experiment(STARLING_SOURCE_DIR "/configs/masha-adversarial.yaml");
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().what));
  REQUIRE(cfg->workload.has_value());
  masha_adversarial_options o;
  auto section = *cfg->workload;
  read_options(section, o);
  section.finish();
  CHECK(o.workers == 10);
  CHECK(o.k == std::vector<double>{0.01, 0.10});
  CHECK(o.data == "auto");
  CHECK(workloads().count("masha-adversarial") == 1);

  CHECK(section_error("  epsilon: 0.2\n").empty());
  CHECK(has(section_error("  epsilon: 2\n"), "masha-adversarial.epsilon: expected a number in [0, 1]"));
  CHECK(has(section_error("  methods: [masha3]\n"), "one of extragradient, masha1, masha2"));
  CHECK(has(section_error("  methods: [masha1, masha1]\n"), "listed twice"));
  CHECK(has(section_error("  k: []\n"), "non-empty list"));
  CHECK(has(section_error("  k: [0]\n"), "fraction of dim(z) in (0, 1]"));
  CHECK(has(section_error("  workers: 10\n  train_per_worker: 7000\n"), "at most 60000"));
  CHECK(has(section_error("  data: mnist\n"), "auto | fashion-mnist | synthetic"));
  CHECK(has(section_error("  timeout: 0s\n"), "positive duration"));
  CHECK(has(section_error("  budget_eg_iterations: 0\n"), "budget_eg_iterations"));
  CHECK(has(section_error("  bogus: 1\n"), "bogus: unknown key"));
}
