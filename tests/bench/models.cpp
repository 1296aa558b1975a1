// Benchmark of the pure training components: a GPT step whole vs. cut into stages (forward, then
// backward recomputing the forward, as stage peers do), Adam vs. LAMB, the load balancer and the
// wiring policy. Prints a table; asserts nothing.
#include "actors/averager/load_balance.hpp"
#include "actors/trainer/wiring.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/optim/optimizer.hpp"

#include <fmt/format.h>

#include <chrono>
#include <random>

using namespace starling;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Mean seconds per call of `f` over `reps` calls after one warm-up call.
template <class F>
double time_it(int reps, F&& f) {
  f();
  auto t0 = clock_type::now();
  for (int i = 0; i < reps; ++i)
    f();
  return seconds_since(t0) / reps;
}

} // namespace

int main() {
  kernels::gpt_config cfg; // 4 layers, width 128, 4 heads, seq_len 128
  const int64_t batch = 16;
  auto gen = kernels::seeded_generator(0);
  auto x = torch::randint(0, 256, {batch, cfg.seq_len}, gen, torch::kLong);
  auto y = torch::roll(x, -1, 1);
  fmt::print("GPT layers={} width={} heads={} seq_len={} batch={} threads={}\n", cfg.layers,
             cfg.width, cfg.heads, cfg.seq_len, batch, torch::get_num_threads());
  fmt::print("{:<44} {:>12}\n", "what", "ms/step");

  for (std::string kind : {"adam", "lamb"}) {
    auto model = kernels::make_gpt(cfg).value();
    auto params = model->ordered_parameters();
    kernels::optimizer_options o;
    o.kind = kind;
    auto opt = std::move(kernels::make_optimizer(o, params)).value();
    auto t = time_it(5, [&] {
      opt->zero_grad();
      model->compute(x, y).backward();
      kernels::clipped_step(*opt, params, o);
    });
    fmt::print("{:<44} {:>12.1f}\n", fmt::format("whole model fwd+bwd+{} (clip 1.0)", kind),
               t * 1e3);
  }

  {
    auto model = kernels::make_gpt(cfg).value();
    auto t = time_it(5, [&] { model->compute(x, y).backward(); });
    fmt::print("{:<44} {:>12.1f}\n", "whole model fwd+bwd", t * 1e3);
  }
  {
    std::vector<std::shared_ptr<kernels::stage_module>> stages{
      kernels::make_gpt_stage(cfg, 0, 2).value(), kernels::make_gpt_stage(cfg, 2, 4).value()};
    auto t = time_it(5, [&] {
      auto a = stages[0]->forward(x).value();
      auto loss = stages[1]->forward(a, y).value();
      auto g = stages[1]->backward(a, {}, y).value();
      stages[0]->backward(x, g.grad_input).value();
    });
    fmt::print("{:<44} {:>12.1f}\n", "2 stages: forward, then backward recomputing", t * 1e3);
  }

  {
    std::mt19937_64 rng(1);
    std::lognormal_distribution<double> bw(0.0, 1.0);
    std::vector<double> b(256);
    for (auto& v : b)
      v = bw(rng);
    auto t = time_it(200, [&] { actors::averager::balance_parts(b, 100'000'000, 1000).value(); });
    fmt::print("{:<44} {:>12.4f}\n", "balance_parts, 256 peers, 1e8 elements", t * 1e3);
  }
  {
    actors::trainer::wiring_policy w(1);
    std::vector<std::string> peers;
    for (int i = 0; i < 1000; ++i)
      peers.push_back(fmt::format("peer{}", i));
    w.refresh(0, peers);
    for (auto& p : peers)
      w.report_success(0, p, actors::trainer::pass::forward, 1.0, 1.0);
    double now = 0;
    auto t = time_it(100000, [&] {
      auto p = w.pick(0, actors::trainer::pass::forward, 1.0, now);
      w.report_success(0, *p, actors::trainer::pass::forward, 1.0, 0.5);
      now += 1e-3;
    });
    fmt::print("{:<44} {:>12.4f}\n", "wiring pick+report, 1000 peers", t * 1e3);
  }
  return 0;
}
