// The bilinear comparison of issue 8: extragradient, MASHA1 (Rand-k) and MASHA2 (Top-k) at
// k = 1% and 10% of d on the default regularized bilinear saddle point (d = 100 per player,
// M = 10 workers), run by the pure cores. Prints the bits per worker to relative error 1e-6 and
// writes `masha-bilinear.svg` (relative error vs bits) into the given folder.
// Usage: example_masha [output-folder]   (default: the current folder)
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "actors/vi/masha.hpp"
#include "runtime/run/masha_comparison.hpp"

using namespace starling;

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : ".";
  const double target = 1e-6;
  auto made = actors::vi::bilinear_problem::make({});
  if (!made) {
    fmt::print(stderr, "example_masha: {}\n", made.error().what);
    return 1;
  }
  auto problem = std::make_shared<const actors::vi::bilinear_problem>(std::move(*made));
  fmt::print("bilinear problem: d = {} (z), M = {}, L = {:.3f}, L~ = {:.3f}, mu = {:.3f}\n",
             problem->dim(), problem->workers(), problem->lipschitz(),
             problem->mean_square_lipschitz(), problem->mu());
  std::vector<runtime::masha_outcome> outcomes;
  for (const auto& e : runtime::masha_entries(*problem, {})) {
    auto r = actors::vi::run_pure(problem, e.options, {200000, target});
    if (!r) {
      // A diverging method is a result of the comparison, not an error of the program.
      fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}  {}\n", e.label, e.options.gamma, e.options.tau,
                 r.error().what);
      outcomes.push_back({e.label, {}, false, 0, r.error().what});
      continue;
    }
    fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}  {} iterations\n", e.label, e.options.gamma,
               e.options.tau, r->iterations);
    outcomes.push_back({e.label, std::move(r->trace), r->reached, r->iterations, {}});
  }
  fmt::print("\n{}", runtime::masha_table(outcomes, target));
  const auto path = out_dir + "/masha-bilinear.svg";
  auto plot = runtime::masha_plot(outcomes, "bilinear saddle point, d = 200, M = 10");
  if (auto st = runtime::plot::write_svg(plot, path); !st) {
    fmt::print(stderr, "example_masha: {}\n", st.what());
    return 1;
  }
  fmt::print("plot: {}\n", path);
  return 0;
}
