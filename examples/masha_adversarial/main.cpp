// The adversarial-training comparison of issue 8 (problem (b)): extragradient, MASHA1 (Rand-k)
// and MASHA2 (Top-k) at k = 1% and 10% of dim(z) on min over a softmax-regression classifier, max
// over a universal L-inf perturbation (eps = 0.1), 10 workers x 100 Fashion-MNIST training images
// (the generated stand-in when the data set is absent), run by the pure cores under a budget of
// 100 extragradient iterations' bits, each method capped at 5000 iterations. Prints clean / adversarial accuracy vs bits and writes
// `masha-adversarial.svg` and `masha-adversarial-clean.svg` into the given folder.
// Usage: example_masha_adversarial [output-folder] [synthetic]   (default: the current folder)
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "actors/vi/adversarial.hpp"
#include "runtime/run/masha_adversarial.hpp"

using namespace starling;

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // progress shows as it happens
  const std::string out_dir = argc > 1 ? argv[1] : ".";
  actors::vi::adversarial_options ao;
  ao.synthetic = argc > 2 && std::strcmp(argv[2], "synthetic") == 0;
  auto made = actors::vi::adversarial_problem::make(ao);
  if (!made) {
    fmt::print(stderr, "example_masha_adversarial: {}\n", made.error().what);
    return 1;
  }
  auto problem = std::make_shared<const actors::vi::adversarial_problem>(std::move(*made));
  actors::vi::use_one_torch_thread();
  if (problem->fell_back())
    fmt::print("Fashion-MNIST not found in {}; using the generated stand-in\n", ao.data_dir);
  const uint64_t budget = runtime::adversarial_budget(*problem, 100);
  fmt::print("adversarial training: dim(z) = {}, M = {}, data {}, L estimate {:.3f}, budget {:.4g} "
             "bits per worker\n",
             problem->dim(), problem->workers(), problem->data_source(), problem->lipschitz(),
             static_cast<double>(budget));
  std::vector<runtime::adversarial_outcome> outcomes;
  for (const auto& e : runtime::masha_entries(*problem, {})) {
    auto r = runtime::run_adversarial_pure(problem, e, budget, 10, 5000);
    if (!r) {
      fmt::print(stderr, "example_masha_adversarial: {}: {}\n", e.label, r.error().what);
      return 1;
    }
    const auto& last = r->points.back();
    fmt::print("  {:<32} gamma {:.5f}  tau {:.4f}  {} iterations: clean {:.1f}%, adversarial "
               "{:.1f}% {}\n",
               e.label, e.options.gamma, e.options.tau, last.iteration,
               100 * last.eval.clean_accuracy, 100 * last.eval.adversarial_accuracy, r->note);
    outcomes.push_back(std::move(*r));
  }
  fmt::print("\n{}", runtime::adversarial_table(outcomes, budget));
  const auto title = fmt::format("adversarial training, eps = {}, dim(z) = {}, M = {}", ao.epsilon,
                                 problem->dim(), problem->workers());
  for (bool adversarial : {true, false}) {
    const auto path =
      out_dir + (adversarial ? "/masha-adversarial.svg" : "/masha-adversarial-clean.svg");
    if (auto st = runtime::plot::write_svg(runtime::adversarial_plot(outcomes, adversarial, title),
                                           path);
        !st) {
      fmt::print(stderr, "example_masha_adversarial: {}\n", st.what());
      return 1;
    }
    fmt::print("plot: {}\n", path);
  }
  return 0;
}
