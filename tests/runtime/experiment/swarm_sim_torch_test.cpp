// The simulated swarm with real compute (`swarm.sim.compute: torch`): the stage peers run the
// model itself on the real data, their device time modeled on CAF's virtual clock. A run learns,
// two runs of a seed are the same run, and a fault's cost is the difference between the run
// with it and the run without it, batch by batch (what scripts/compare-runs prints).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/yaml.hpp"
#include "runtime/run/swarm.hpp"

namespace starling::test::runtime_swarm_sim_torch_test {

using namespace starling;
using namespace starling::runtime;

namespace {

/// Two stages of two peers each (peers 0-1 serve stage 0, 2-3 stage 1), two trainers, a tiny
/// byte GPT; gradients averaged every 32 samples.
std::string tiny(const std::string& faults) {
  return R"(
experiment: {name: simtorch, kind: swarm, seed: 11, duration: 600s}
network:
  defaults: {latency: 5ms, bandwidth: 100MB/s}
swarm:
  model: {layers: 2, width: 32, heads: 2, seq_len: 16}
  data: {kind: text}
  stages: [{peers: [1.0, 0.6]}, {peers: [1.0, 0.8]}]
  trainers: 2
  microbatch: 8
  microbatches_per_trainer: 48
  max_inflight: 2
  target_batch: 32
  averaging: {progress_period: 250ms, matchmaking_window: 750ms, round_timeout: 10s}
  optimizer: {kind: adam, lr: 1e-3, warmup_steps: 3, max_grad_norm: 1.0}
  compression: blockwise8
  hop_timeout: 10s
  preempt_every: 0s
  restart_delay: 3s
  eval_batches: 2
  checkpoint: {every: 0s}
  sim: {compute: torch, forward_per_sample: 5ms, backward_factor: 2}
faults:
)" + faults;
}

/// Every completed microbatch's loss by (trainer, batch), with its completion time.
struct loss_log {
  std::map<std::pair<std::string, int64_t>, std::pair<double, double>> batches;
  std::vector<double> faults;
};

class log_reporter : public reporter {
public:
  explicit log_reporter(std::shared_ptr<loss_log> log) : log_(std::move(log)) {}
  void on_metric(const metric_record& m) override {
    if (m.kind == "microbatch")
      log_->batches[{m.source, static_cast<int64_t>(m.value("batch", -1))}] = {m.t,
                                                                               m.value("loss")};
    else if (m.kind == "fault")
      log_->faults.push_back(m.t);
  }

private:
  std::shared_ptr<loss_log> log_;
};

struct torch_run {
  run_result result;
  std::shared_ptr<loss_log> log = std::make_shared<loss_log>();
};

torch_run simulate(const std::string& yaml) {
  auto reg = builtin_registry();
  graph_load_options lo;
  lo.mode = run_mode::sim;
  auto ex = read_experiment(load_yaml_string(yaml, "simtorch.yaml"), reg, lo);
  torch_run r;
  auto log = r.log;
  // The graph's own reporter (the swarm summary: held-out loss, bursts) and the log.
  ex.graph.reporters.push_back([log] { return std::make_unique<log_reporter>(log); });
  run_settings s;
  s.trace_messages = false;
  s.write_trace = false;
  r.result = run_in_process(ex.graph, reg, run_mode::sim, s);
  return r;
}

/// Mean loss of the first and of the last `n` microbatches in completion order.
std::pair<double, double> first_last(const loss_log& log, size_t n) {
  std::vector<std::pair<double, double>> v;
  for (auto& [k, tl] : log.batches)
    v.push_back(tl);
  std::sort(v.begin(), v.end());
  n = std::min(n, v.size() / 2);
  double a = 0, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a += v[i].second;
    b += v[v.size() - 1 - i].second;
  }
  return {a / static_cast<double>(n), b / static_cast<double>(n)};
}

} // namespace

TEST_CASE("simulated swarm with real compute: it learns, and the same seed is the same run") {
  auto a = simulate(tiny(""));
  auto b = simulate(tiny(""));
  REQUIRE(a.log->batches.size() == 96);
  auto [first, last] = first_last(*a.log, 16);
  MESSAGE("loss of the first 16 microbatches " << first << ", of the last 16 " << last
                                               << "; wall " << a.result.wall_s << " s");
  CHECK(last < first - 0.5);
  CHECK(a.result.exit_code == 0); // the reporter's verdict: the held-out loss fell
  CHECK(a.result.trace_digest == b.result.trace_digest);
  CHECK(a.log->batches == b.log->batches);
}

TEST_CASE("simulated swarm with real compute and lamb8: it learns, and a killed stage peer "
          "resumes from a download of 8-bit codes and scales") {
  auto yaml = tiny("  - {kill: peers, instance: 3, at: 4.5s, restart_after: 3s}\n");
  const std::string adam = "optimizer: {kind: adam, lr: 1e-3,";
  auto at = yaml.find(adam);
  REQUIRE(at != std::string::npos);
  // LAMB steps each tensor by lr * ||w||: it wants a larger lr than Adam.
  yaml.replace(at, adam.size(), "optimizer: {kind: lamb8, lr: 2e-2,");
  auto r = simulate(yaml);
  REQUIRE(r.log->faults.size() == 1);
  REQUIRE(r.log->batches.size() == 96);
  auto [first, last] = first_last(*r.log, 16);
  MESSAGE("lamb8: loss of the first 16 microbatches " << first << ", of the last 16 " << last);
  CHECK(last < first - 0.5);
  CHECK(r.result.exit_code == 0);
}

TEST_CASE("simulated swarm with real compute: a stage peer killed during training costs no "
          "burst, batch by batch against the run without the fault") {
  auto base = simulate(tiny(""));
  REQUIRE(base.log->batches.size() == 96);
  // Peer 3 (stage 1, speed 0.8) at five points of a step (a step takes ~2 s here: 32 samples
  // through the slower peers), mid-round for some of them; it restarts 3 s later and downloads
  // the state.
  for (std::string at : {"4.1s", "4.5s", "4.9s", "5.3s", "5.7s"}) {
    CAPTURE(at);
    auto faulty = simulate(tiny("  - {kill: peers, instance: 3, at: " + at
                                + ", restart_after: 3s}\n"));
    REQUIRE(faulty.log->faults.size() == 1);
    REQUIRE(faulty.log->batches.size() == 96);
    // Identical before the fault: the simulation replays the same run up to it.
    double worst = -1e9, sum = 0;
    int64_t after = 0;
    for (auto& [key, tl] : faulty.log->batches) {
      auto it = base.log->batches.find(key);
      REQUIRE(it != base.log->batches.end());
      auto d = tl.second - it->second.second;
      if (tl.first < faulty.log->faults[0]) {
        CHECK(d == 0.0);
        continue;
      }
      worst = std::max(worst, d);
      sum += d;
      after++;
    }
    REQUIRE(after > 0);
    auto mean = sum / static_cast<double>(after);
    MESSAGE("kill at " << at << ": largest per-batch loss increase " << worst
                       << ", mean difference after the fault " << mean);
    // The bounds. After the fault the two runs group samples into steps differently, and two
    // such trajectories differ batch by batch (measured at lr 1e-3: at most +0.016 per batch,
    // the faulty run 0.07-0.09 lower on average, where its survivors took more, smaller
    // steps); the fault's cost is what exceeds that. Before the deserted-peer rule
    // (actors/collab/coordinator.hpp) the survivor of a kill at 5.7 s waited out a matchmaking
    // window for every step and lost 6 of 9 steps: +0.93 at worst, +0.30 on average; with
    // gradients computed when a request arrived rather than when the device ran it, and a
    // window of 12 microbatches per trainer, the kill at 5.3 s set off a divergence of +3.6
    // (issue 38). lr 1e-3 as in make run: at 3e-3 this model diverges late in some seeds
    // without any fault, and a fault that shifts the trajectory would be blamed for it.
    CHECK(worst < 0.25);
    CHECK(mean < 0.05);
    CHECK(faulty.result.exit_code == 0);
  }
}

} // namespace starling::test::runtime_swarm_sim_torch_test
