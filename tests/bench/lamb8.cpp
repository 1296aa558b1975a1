// Benchmark of lamb8 (LAMB with blockwise 8-bit moments) against LAMB on a GPT: optimizer state
// bytes (held in memory, and as `save_optimizer_state` writes them for downloads and
// checkpoints), peak resident memory and the optimizer step's time. Each optimizer runs in a
// child process of its own (this program again, with --kind), so that each peak RSS is its own;
// one thread each. Prints a table; asserts nothing.
//   bench_lamb8 [--width W] [--layers L] [--steps S]     (defaults 512, 4, 10)
#include "kernels/optim/lamb8.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/optim/lamb.hpp"
#include "kernels/optim/optimizer.hpp"
#include "runtime/metrics/metrics.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace starling;
using clock_type = std::chrono::steady_clock;

namespace {

struct args {
  int64_t width = 512;
  int64_t layers = 4;
  int steps = 10;
  std::string kind; // set in a child
};

uint64_t rss_bytes() {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

/// One optimizer's measurements, printed by the child as one line of numbers.
int child(const args& a) {
  torch::set_num_threads(1);
  kernels::gpt_config cfg;
  cfg.width = a.width;
  cfg.layers = a.layers;
  cfg.heads = 4;
  cfg.seq_len = 16;
  auto model = kernels::make_gpt(cfg).value();
  auto params = model->ordered_parameters();
  // Gradients from one small batch: activations stay small beside the optimizer state.
  auto gen = kernels::seeded_generator(0);
  auto x = torch::randint(0, cfg.vocab, {1, cfg.seq_len}, gen, torch::kLong);
  model->compute(x, torch::roll(x, -1, 1)).backward();
  auto before = rss_bytes();
  kernels::optimizer_options o;
  o.kind = a.kind;
  auto opt = std::move(kernels::make_optimizer(o, params)).value();
  opt->step();
  opt->step();
  auto t0 = clock_type::now();
  for (int i = 0; i < a.steps; ++i)
    opt->step();
  auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count() / a.steps;
  auto peak = runtime::peak_rss_bytes();
  uint64_t held = 0;
  if (auto* l8 = dynamic_cast<kernels::lamb8*>(opt.get()))
    held = l8->state_bytes();
  else
    for (auto& [key, s] : opt->state()) {
      auto& st = static_cast<kernels::lamb_param_state&>(*s);
      held += st.exp_avg().nbytes() + st.exp_avg_sq().nbytes() + sizeof(int64_t);
    }
  auto saved = kernels::save_optimizer_state(*opt).value().size();
  fmt::print("{} {} {} {} {:.2f} {} {}\n", a.kind, kernels::total_numel(params), held, saved, ms,
             before, peak);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--width")
      a.width = std::stoll(v);
    else if (k == "--layers")
      a.layers = std::stoll(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--kind")
      a.kind = v;
    else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  if (!a.kind.empty())
    return child(a);
  fmt::print("GPT layers={} width={} (one thread, optimizer step only, mean of {} steps)\n",
             a.layers, a.width, a.steps);
  fmt::print("{:<7} {:>11} {:>14} {:>14} {:>10} {:>13} {:>12} {:>14}\n", "kind", "params",
             "state held B", "state saved B", "ms/step", "RSS before MB", "peak RSS MB",
             "peak-before MB");
  std::vector<std::pair<std::string, uint64_t>> held;
  for (std::string kind : {"lamb", "lamb8"}) {
    auto cmd = fmt::format("/proc/{}/exe --kind {} --width {} --layers {} --steps {}", getpid(),
                           kind, a.width, a.layers, a.steps);
    auto* p = popen(cmd.c_str(), "r");
    if (p == nullptr)
      return 1;
    char name[16] = {};
    unsigned long long numel = 0, h = 0, saved = 0, before = 0, peak = 0;
    double ms = 0;
    auto n = fscanf(p, "%15s %llu %llu %llu %lf %llu %llu", name, &numel, &h, &saved, &ms, &before,
                    &peak);
    pclose(p);
    if (n != 7) {
      fmt::print(stderr, "{}: the child printed no result\n", kind);
      return 1;
    }
    fmt::print("{:<7} {:>11} {:>14} {:>14} {:>10.1f} {:>13.1f} {:>12.1f} {:>14.1f}\n", kind, numel,
               h, saved, ms, before / 1e6, peak / 1e6, (peak - before) / 1e6);
    held.emplace_back(kind, h);
  }
  fmt::print("lamb8 holds {:.1f}% of lamb's optimizer state\n",
             100.0 * static_cast<double>(held[1].second) / static_cast<double>(held[0].second));
  return 0;
}
