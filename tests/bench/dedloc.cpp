// Collaborative training benchmarks (issue 20), all in simulation (virtual time; LibTorch runs
// for real, so accuracy is real):
//   accuracy    DeDLOC (8 peers, speeds 1 to 0.25, 2 in client mode) against one peer alone with
//               the same global batch: test accuracy after the same number of global steps.
//   diloco      bytes sent per peer to reach DeDLOC's accuracy minus 1 point, for DiLoCo with the
//               pseudo-gradients in fp32, blockwise8 and Top-k 0.5% with error feedback, as the
//               ratio DeDLOC bytes / DiLoCo bytes.
//   throughput  the cost-model backend: samples/s of 1, 4, 16 and 64 peers on 100 Mbit/s links
//               against the sum of the peers' speeds (the bound).
// Usage: bench_dedloc [accuracy] [diloco] [throughput] [--steps N] [--outer-batch B] [--budget X]
//                     [--peers N[,N...]] [--variants I[,I...]]
//   (default: all, 60 steps; DiLoCo with an outer step every 8192 and every 32768 samples of the
//   collaboration, each with at most X = 3 times the samples of DeDLOC's run: DiLoCo trades
//   compute for bytes, and the table says how many samples it used; the throughput table's rows
//   are 1, 4, 16 and 64 peers unless --peers names others, and its columns (0: a window per
//   step, 1: persistent rounds, 2: persistent + delayed updates) all unless --variants names some)
// Prints tables; asserts nothing.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/experiment/allocator.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/run/dedloc.hpp"
#include "runtime/run/kinds.hpp"

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// Evaluations (mean over peers) by step, bytes sent per peer at each, samples by step.
struct outcome {
  std::map<uint64_t, std::vector<double>> acc, bytes;
  std::map<uint64_t, double> step_samples;
  double samples = 0;
  uint64_t steps = 0;
  double run_s = 0, wall_s = 0;

  double mean(const std::vector<double>& v) const {
    double s = 0;
    for (auto x : v)
      s += x;
    return v.empty() ? std::nan("") : s / static_cast<double>(v.size());
  }
  /// Accuracy at the last evaluated step <= `step`.
  double accuracy_at(uint64_t step) const {
    auto it = acc.upper_bound(step);
    return it == acc.begin() ? std::nan("") : mean(std::prev(it)->second);
  }
  /// Mean bytes sent per peer at the first evaluation reaching `target` (NaN: never).
  double bytes_to(double target, uint64_t* at = nullptr) const {
    for (auto& [step, v] : acc)
      if (mean(v) >= target) {
        if (at)
          *at = step;
        return mean(bytes.at(step));
      }
    return std::nan("");
  }
  /// Samples in the updates before step `step`.
  double samples_before(uint64_t step) const {
    double s = 0;
    for (auto& [k, n] : step_samples)
      if (k < step)
        s += n;
    return s;
  }
};

/// Collects metrics; ends the run once some peer took `stop_at` steps.
class bench_reporter : public reporter {
public:
  bench_reporter(std::shared_ptr<outcome> out, uint64_t stop_at)
      : out_(std::move(out)), stop_at_(stop_at) {}

  void on_metric(const metric_record& m) override {
    if (m.kind == "dp_step") {
      auto step = static_cast<uint64_t>(m.value("step"));
      out_->step_samples[step] += m.value("samples");
      out_->samples += m.value("samples");
      out_->steps = std::max(out_->steps, step + 1);
    } else if (m.kind == "dp_eval") {
      auto step = static_cast<uint64_t>(m.value("step"));
      out_->acc[step].push_back(m.value("accuracy"));
      out_->bytes[step].push_back(m.value("bytes_sent"));
    }
  }

  bool tick(double) override { return stop_at_ > 0 && out_->steps >= stop_at_; }

  int finish(finish_context& ctx) override {
    out_->run_s = ctx.run_s;
    out_->wall_s = ctx.wall_s;
    return 0;
  }

private:
  std::shared_ptr<outcome> out_;
  uint64_t stop_at_;
};

std::shared_ptr<outcome> run(const std::string& name, const dedloc_role_options& o, size_t peers,
                             uint64_t stop_at, std::chrono::nanoseconds duration, double bandwidth,
                             size_t nodes = 0) {
  auto out = std::make_shared<outcome>();
  auto reg = builtin_registry();
  experiment_builder b{name};
  b.seed(7).duration(duration).nodes(nodes);
  network_options net;
  net.defaults.latency = 20ms;
  net.defaults.bandwidth = bandwidth;
  b.network(net);
  b.role("peers", "dedloc.peer", o).replicas(peers);
  b.reporter([out, stop_at] { return std::make_unique<bench_reporter>(out, stop_at); });
  auto g = b.build(reg, run_mode::sim);
  if (!g) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), g.error().what.c_str());
    std::exit(2);
  }
  run_settings s;
  s.trace_messages = false;
  s.write_trace = false;
  auto res = run_in_process(*g, reg, run_mode::sim, s);
  out->run_s = res.run_s;
  out->wall_s = res.wall_s;
  return out;
}

dedloc_role_options fmnist() {
  dedloc_role_options o;
  o.backend = "torch";
  o.data.idx.synthetic_when_absent = true; // only when the Fashion-MNIST files are absent
  o.torch.model.width = 128;
  o.torch.model.layers = 1;
  o.torch.optimizer.lr = 0.002;
  o.torch.stream.microbatch = 32;
  o.peer.collab.progress.target_batch = 1024;
  o.peer.compute_time = 40ms;
  o.peer.eval_every = 5;
  o.torch.eval_samples = 10000;
  return o;
}

const double mbit100 = 100e6 / 8;

void accuracy(uint64_t steps) {
  std::printf("\n== DeDLOC vs one peer with the same global batch (1024), Fashion-MNIST, MLP "
              "784-128-10, Adam 2e-3, %llu steps\n",
              static_cast<unsigned long long>(steps));
  // Evaluated after every step, so that the comparison at equal samples reads the accuracy of
  // the step it names (not of the last multiple of 5 before it).
  auto single = fmnist();
  single.peer.eval_every = 1;
  auto collab = single;
  collab.speeds = {1.0, 0.9, 0.8, 0.7, 0.55, 0.45, 0.35, 0.25};
  collab.cycle = 8;
  collab.clients = 2;
  auto a = run("single", single, 1, steps, 30min, mbit100);
  collab.averager.family_groups = false;
  auto b = run("dedloc", collab, 8, steps, 30min, mbit100);
  auto fast = collab;
  fast.averager.family_groups = true; // the default
  auto c = run("dedloc-persistent", fast, 8, steps, 30min, mbit100);
  auto delayed = fast;
  delayed.peer.collab.delay_updates = true;
  auto d = run("dedloc-delayed", delayed, 8, steps, 30min, mbit100);
  std::printf("  %-44s %8s %12s %10s %12s %10s\n", "run", "steps", "samples", "test acc",
              "virtual s", "wall s");
  for (auto [label, r] : {std::pair{"one peer", a}, std::pair{"8 peers (2 clients), window per step", b},
                          std::pair{"8 peers, persistent rounds (default)", c},
                          std::pair{"8 peers, persistent, delayed updates", d}}) {
    std::printf("  %-44s %8llu %12.0f %9.2f%% %12.1f %10.1f\n", label,
                static_cast<unsigned long long>(steps), r->samples_before(steps),
                100 * r->accuracy_at(steps), r->run_s, r->wall_s);
  }
  std::printf("  difference at %llu steps: %.2f points with a window per step, %.2f with persistent "
              "rounds, %.2f with delayed updates too (goal: within 0.5)\n",
              static_cast<unsigned long long>(steps),
              100 * (b->accuracy_at(steps) - a->accuracy_at(steps)),
              100 * (c->accuracy_at(steps) - a->accuracy_at(steps)),
              100 * (d->accuracy_at(steps) - a->accuracy_at(steps)));
  // At the same number of samples: the collaboration's steps hold about the target batch, a
  // little more or less (the peers' samples are predicted from their rates between reads).
  for (auto [label, r] : {std::pair{"8 peers, window per step", b},
                          std::pair{"8 peers, persistent rounds", c},
                          std::pair{"8 peers, delayed updates", d}}) {
    uint64_t k = 0;
    while (k < r->steps && r->samples_before(k + 1) <= a->samples_before(steps))
      k++;
    std::printf("  %s at %.0f samples (step %llu): %.2f%%, %.2f points from one peer\n", label,
                r->samples_before(k), static_cast<unsigned long long>(k), 100 * r->accuracy_at(k),
                100 * (r->accuracy_at(k) - a->accuracy_at(steps)));
  }
}

void diloco(uint64_t steps, uint64_t outer_batch, double budget) {
  std::printf("\n== DiLoCo: bytes sent per peer to reach DeDLOC's accuracy - 1 point (8 peers, "
              "speeds 1 to 0.25, 2 clients; outer step every %llu samples, inner batch 128, at "
              "most %.1fx DeDLOC's samples)\n",
              static_cast<unsigned long long>(outer_batch), budget);
  auto base = fmnist();
  base.speeds = {1.0, 0.9, 0.8, 0.7, 0.55, 0.45, 0.35, 0.25};
  base.cycle = 8;
  base.clients = 2;
  auto ded = run("dedloc", base, 8, steps, 30min, mbit100);
  auto final_acc = ded->accuracy_at(steps);
  auto target = final_acc - 0.01;
  auto samples = ded->samples_before(steps);
  uint64_t ded_at = 0;
  auto ded_bytes = ded->bytes_to(target, &ded_at);
  std::printf("  DeDLOC: %.2f%% after %llu steps (%.0f samples); reaches %.2f%% at step %llu "
              "with %.2f MB sent per peer\n",
              100 * final_acc, static_cast<unsigned long long>(steps), samples, 100 * target,
              static_cast<unsigned long long>(ded_at), ded_bytes / 1e6);
  std::printf("  %-34s %10s %12s %12s %10s %10s\n", "pseudo-gradient codec", "best acc",
              "MB to target", "ratio", "outer", "samples");
  struct variant {
    const char* name;
    const char* codec;
    bool ef;
  };
  for (auto v : {variant{"fp32", "none", false}, variant{"blockwise8", "blockwise8", false},
                 variant{"top-k 0.5% + EF both sides", "topk", true}}) {
    auto o = base;
    o.peer.algo = starling::actors::dp_peer::algorithm::diloco;
    o.peer.inner_batch = 128;
    o.peer.collab.progress.target_batch = outer_batch;
    o.peer.eval_every = 1;
    o.peer.diloco.codec = *starling::kernels::parse_codec(v.codec);
    o.peer.diloco.codec_params.ratio = 0.005;
    o.peer.diloco.error_feedback = v.ef;
    o.peer.diloco.outer.lr = 0.7;
    o.peer.diloco.outer.momentum = v.ef ? 0.0 : 0.9;
    o.peer.diloco.outer.nesterov = !v.ef;
    // DeDLOC's samples times `budget` (DiLoCo trades compute for bytes).
    auto outer_steps = static_cast<uint64_t>(
        std::ceil(budget * samples / static_cast<double>(outer_batch)));
    auto r = run(std::string("diloco-") + v.codec, o, 8, outer_steps, 30min, mbit100);
    double best = 0;
    for (auto& [k, a] : r->acc)
      best = std::max(best, r->mean(a));
    uint64_t at = 0;
    auto bytes = r->bytes_to(target, &at);
    std::printf("  %-34s %9.2f%% %12.3f %12.1f %10llu %10.0f\n", v.name, 100 * best, bytes / 1e6,
                ded_bytes / bytes, static_cast<unsigned long long>(at), r->samples_before(at));
  }
  std::printf("  (ratio: DeDLOC MB / DiLoCo MB to the target; goal >= 50; NaN: target not "
              "reached)\n");
}

std::vector<size_t> numbers(const char* list, const char* what) {
  std::vector<size_t> out;
  for (const char* p = list; *p;) {
    char* end = nullptr;
    auto v = std::strtoull(p, &end, 10);
    if (end == p || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "bench_dedloc: %s: expected numbers separated by commas, got '%s'\n",
                   what, list);
      std::exit(2);
    }
    out.push_back(static_cast<size_t>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

void throughput(const std::vector<size_t>& peers, const std::vector<size_t>& columns) {
  std::printf("\n== Throughput, cost model: 1M-parameter model (4 MB fp32), 32-sample "
              "microbatches of 100 ms at speed 1, target batch 4096, 100 Mbit/s links, 20 ms\n");
  std::printf("  %6s %-22s %14s %14s %8s %10s %8s\n", "peers", "rounds", "samples/s", "bound",
              "ratio", "steps", "wall s");
  struct variant {
    const char* name;
    bool persistent, delayed;
  };
  const variant variants[] = {{"window per step", false, false},
                              {"persistent", true, false},
                              {"persistent + delayed", true, true}};
  for (size_t n : peers) {
    if (n == 0)
      continue;
    dedloc_role_options o;
    o.backend = "modeled";
    o.modeled.numel = 1'000'000;
    o.torch.stream.microbatch = 32;
    o.peer.compute_time = 100ms;
    o.peer.collab.progress.target_batch = 4096;
    o.peer.eval_every = 0;
    auto bound = static_cast<double>(n) * 32 / 0.1;
    for (size_t k : columns) {
      const auto& v = variants[k];
      o.averager.family_groups = v.persistent;
      o.peer.collab.delay_updates = v.delayed;
      auto r = run("throughput", o, n, 0, 120s, mbit100, std::min<size_t>(n, 16));
      auto rate = r->samples / r->run_s;
      std::printf("  %6zu %-22s %14.0f %14.0f %7.1f%% %10llu %8.1f\n", n, v.name, rate, bound,
                  100 * rate / bound, static_cast<unsigned long long>(r->steps), r->wall_s);
    }
  }
  std::printf("  (samples/s: samples in updates over the run's virtual time, the first "
              "matchmaking included)\n");
}

} // namespace

int main(int argc, char** argv) {
  starling::runtime::fix_mmap_threshold(); // as the `starling` command does
  std::set<std::string> what;
  uint64_t steps = 60, outer_batch = 0;
  double budget = 3;
  std::vector<size_t> peers = {1, 4, 16, 64}, columns = {0, 1, 2};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      steps = std::strtoull(argv[++i], nullptr, 10);
    else if (std::strcmp(argv[i], "--outer-batch") == 0 && i + 1 < argc)
      outer_batch = std::strtoull(argv[++i], nullptr, 10);
    else if (std::strcmp(argv[i], "--budget") == 0 && i + 1 < argc)
      budget = std::strtod(argv[++i], nullptr);
    else if (std::strcmp(argv[i], "--peers") == 0 && i + 1 < argc)
      peers = numbers(argv[++i], "--peers");
    else if (std::strcmp(argv[i], "--variants") == 0 && i + 1 < argc) {
      columns = numbers(argv[++i], "--variants");
      for (size_t k : columns)
        if (k > 2) {
          std::fprintf(stderr, "bench_dedloc: --variants: %zu is not 0, 1 or 2\n", k);
          return 2;
        }
    }
    else if (std::strcmp(argv[i], "accuracy") == 0 || std::strcmp(argv[i], "diloco") == 0 ||
             std::strcmp(argv[i], "throughput") == 0)
      what.insert(argv[i]);
    else {
      std::fprintf(stderr, "bench_dedloc: unknown argument '%s' (see the usage at the top of "
                           "tests/bench/dedloc.cpp)\n", argv[i]);
      return 2;
    }
  }
  auto all = what.empty();
  if (all || what.count("accuracy"))
    accuracy(steps);
  if (all || what.count("diloco"))
    for (uint64_t b : outer_batch > 0 ? std::vector<uint64_t>{outer_batch}
                                      : std::vector<uint64_t>{8192, 32768})
      diloco(steps, b, budget);
  if (all || what.count("throughput"))
    throughput(peers, columns);
  return 0;
}
