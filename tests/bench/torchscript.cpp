// Benchmark: a stage step (forward without autograd, then backward recomputing the forward, as a
// stage peer serves a microbatch) of the GPT scripted in PyTorch (examples/torchscript, written by
// /usr/bin/python3 at start) against the built-in GPT stage of the same architecture. Prints a
// table; asserts nothing.
//
//   build/bench_torchscript [layers width heads seq_len batch reps]   (default 4 128 4 128 16 20)
#include "kernels/models/gpt.hpp"
#include "kernels/models/torchscript.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

using namespace starling;
using clock_type = std::chrono::steady_clock;

namespace {

/// Median seconds of `reps` calls of `f` after three warm-up calls (the TorchScript executor
/// profiles and optimizes its first runs).
template <class F>
double median_time(int reps, F&& f) {
  for (int i = 0; i < 3; ++i)
    f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// One stage step: forward, then backward from `grad` (or the loss for the last stage).
void step(kernels::stage_module& s, const torch::Tensor& x, const torch::Tensor& y,
          const torch::Tensor& grad) {
  auto out = s.forward(x, s.is_last() ? y : torch::Tensor{});
  if (!out)
    throw std::runtime_error(out.error().what);
  auto g = s.backward(x, s.is_last() ? torch::Tensor{} : grad, s.is_last() ? y : torch::Tensor{});
  if (!g)
    throw std::runtime_error(g.error().what);
  s.zero_grad();
}

} // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> a{4, 128, 4, 128, 16, 20};
  for (int i = 1; i < argc && i <= 6; ++i)
    a[static_cast<size_t>(i - 1)] = std::atoll(argv[i]);
  kernels::gpt_config cfg;
  cfg.layers = a[0];
  cfg.width = a[1];
  cfg.heads = a[2];
  cfg.seq_len = a[3];
  auto batch = a[4];
  auto reps = static_cast<int>(a[5]);
  torch::set_num_threads(1); // a stage peer's default (swarm.torch_threads: 1)

  char tmpl[] = "/tmp/starling-bench-ts-XXXXXX";
  if (!::mkdtemp(tmpl))
    return 1;
  std::string dir = tmpl;
  auto cmd = fmt::format("/usr/bin/python3 {}/examples/torchscript/prepare.py {} --layers {} "
                         "--width {} --heads {} --seq-len {} --stages 2 --train-bytes 10000 "
                         "--val-bytes 10000 >/dev/null",
                         STARLING_SOURCE_DIR, dir, cfg.layers, cfg.width, cfg.heads, cfg.seq_len);
  if (std::system(cmd.c_str()) != 0) {
    fmt::print(stderr, "bench_torchscript: {} failed (is python3-torch installed?)\n", cmd);
    return 1;
  }
  kernels::torchscript_config ts;
  ts.files = {dir + "/stage0.pt", dir + "/stage1.pt"};
  ts.seq_len = cfg.seq_len;
  kernels::torchscript_config whole = ts;
  whole.files = {dir + "/whole.pt"};
  auto ranges = *kernels::even_stage_ranges(cfg.layers, 2);

  auto gen = kernels::seeded_generator(0);
  auto x = torch::randint(0, 256, {batch, cfg.seq_len}, gen, torch::kLong);
  auto y = torch::roll(x, -1, 1);
  auto act = torch::randn({batch, cfg.seq_len, cfg.width}, gen);
  auto grad = torch::randn({batch, cfg.seq_len, cfg.width}, gen) * 1e-3;

  fmt::print("stage step (forward, then backward recomputing it) of a GPT {} layers x {}, {} "
             "heads, batch {} x {} tokens, 1 thread, median of {}\n",
             cfg.layers, cfg.width, cfg.heads, batch, cfg.seq_len, reps);
  fmt::print("  {:<28} {:>12} {:>14} {:>8}\n", "stage", "built-in ms", "TorchScript ms", "ratio");
  struct row {
    std::string name;
    std::shared_ptr<kernels::stage_module> builtin, scripted;
    torch::Tensor input;
  };
  std::vector<row> rows{
    {fmt::format("first [{}, {})", ranges[0].first, ranges[0].second),
     *kernels::make_gpt_stage(cfg, ranges[0].first, ranges[0].second),
     *kernels::make_torchscript_stage(ts, 0, 1), x},
    {fmt::format("last [{}, {})", ranges[1].first, ranges[1].second),
     *kernels::make_gpt_stage(cfg, ranges[1].first, ranges[1].second),
     *kernels::make_torchscript_stage(ts, 1, 2), act},
    {fmt::format("whole model [0, {})", cfg.layers), *kernels::make_gpt(cfg),
     *kernels::make_torchscript_stage(whole, 0, 1), x},
  };
  for (auto& r : rows) {
    auto tb = median_time(reps, [&] { step(*r.builtin, r.input, y, grad); });
    auto tt = median_time(reps, [&] { step(*r.scripted, r.input, y, grad); });
    fmt::print("  {:<28} {:>12.2f} {:>14.2f} {:>8.3f}\n", r.name, tb * 1e3, tt * 1e3, tt / tb);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
