// Why MASHA2 (Top-k + error feedback) stalls at k = 1% on the bilinear problem: scans its step
// size γ = c · δ / L (δ = k/d, the error-feedback scale) and sqrt(δ)/(2L) (the default), τ, and the
// downlink (Top-k with server error feedback, or dense), printing iterations and bits per worker
// to relative error 1e-6 (or the error reached at the iteration cap). Asserts nothing.
// Usage: bench_masha2_small_k [k] [max-iterations]   (defaults: 2, 100000)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "actors/vi/masha.hpp"

using namespace starling::actors::vi;

int main(int argc, char** argv) {
  const std::size_t k = argc > 1 ? static_cast<std::size_t>(std::atoi(argv[1])) : 2;
  const std::size_t cap = argc > 2 ? static_cast<std::size_t>(std::atol(argv[2])) : 100000;
  auto p = std::make_shared<const bilinear_problem>(*bilinear_problem::make({}));
  const double l = p->lipschitz();
  const double delta = static_cast<double>(k) / static_cast<double>(p->dim());
  auto eg = run_pure(p, recommended_options(method_kind::extragradient, *p, {}, {}), {cap, 1e-6});
  const double eg_all = static_cast<double>(eg->trace.back().bits_up + eg->trace.back().bits_down);
  std::printf("bilinear d=%zu M=%zu L=%.3f mu=%.3f; MASHA2 top-k k=%zu (delta=%.3f); EG %zu it, "
              "%.3g bits both directions\n",
              p->dim(), p->workers(), l, p->mu(), k, delta, eg->iterations, eg_all);
  std::printf("  %-44s %8s %8s %9s %12s %10s\n", "variant", "gamma", "1-tau", "iters",
              "bits both", "EG/both");
  struct row {
    std::string name;
    double gamma;
    double one_minus_tau;
    bool dense_down;
  };
  std::vector<row> rows;
  const double g_default = std::sqrt(delta) / (2 * l);
  rows.push_back({"default: sqrt(delta)/(2L), top-k down", g_default, delta, false});
  for (double c : {0.25, 0.5, 1.0, 2.0})
    rows.push_back({"c*delta/L, top-k down, c=" + std::to_string(c).substr(0, 4), c * delta / l,
                    delta, false});
  for (double c : {0.5, 1.0, 2.0})
    rows.push_back({"c*delta/L, dense down, c=" + std::to_string(c).substr(0, 4), c * delta / l,
                    delta, true});
  rows.push_back({"sqrt(delta)/(2L), dense down", g_default, delta, true});
  rows.push_back({"delta/L, top-k down, 1-tau = sqrt(delta)", delta / l, std::sqrt(delta), false});
  for (const auto& r : rows) {
    method_options o;
    o.method = method_kind::masha2;
    o.worker_codec = {codec_kind::top_k, k};
    o.server_codec = r.dense_down ? codec_spec{codec_kind::dense, 0} : codec_spec{codec_kind::top_k, k};
    o.gamma = r.gamma;
    o.tau = 1.0 - r.one_minus_tau;
    o.seed = 1;
    auto res = run_pure(p, o, {cap, 1e-6});
    if (!res) {
      std::printf("  %-44s %8.4f %8.3f %9s %12s %10s  %s\n", r.name.c_str(), r.gamma,
                  r.one_minus_tau, "-", "-", "-", res.error().what.c_str());
      continue;
    }
    const auto& last = res->trace.back();
    const double all = static_cast<double>(last.bits_up + last.bits_down);
    if (res->reached)
      std::printf("  %-44s %8.4f %8.3f %9zu %12.4g %10.2f\n", r.name.c_str(), r.gamma,
                  r.one_minus_tau, res->iterations, all, eg_all / all);
    else
      std::printf("  %-44s %8.4f %8.3f %9zu %12.4g %10s  error %.2e at the cap\n", r.name.c_str(),
                  r.gamma, r.one_minus_tau, res->iterations, all, "-", last.relative_error);
    std::fflush(stdout);
  }
  return 0;
}
