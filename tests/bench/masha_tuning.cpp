// Scans MASHA's step-size multiplier over the compressor variants and the problem's heterogeneity:
// bits per worker to reach relative error 1e-6 as the ratio extragradient / method, uplink only
// ("up") and both directions ("all"). Prints a table; asserts nothing.
// Usage: bench_masha_tuning [heterogeneity...]   (default 0.5)
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "actors/vi/masha.hpp"

using namespace starling::actors::vi;

namespace {

struct variant {
  const char* name;
  method_kind method;
  codec_kind worker;
  codec_kind server;
  bool shared;
};

} // namespace

int main(int argc, char** argv) {
  std::vector<double> hs;
  for (int i = 1; i < argc; ++i)
    hs.push_back(std::atof(argv[i]));
  if (hs.empty())
    hs.push_back(0.5);
  for (double h : hs) {
    bilinear_options bo;
    bo.heterogeneity = h;
    auto p = std::make_shared<const bilinear_problem>(*bilinear_problem::make(bo));
    auto eg =
        run_pure(p, recommended_options(method_kind::extragradient, *p, {}, {}), {100000, 1e-6});
    const double up_eg = eg->trace.back().bits_up;
    const double all_eg = up_eg + eg->trace.back().bits_down;
    std::printf("h=%.2f  L=%.3f  L~=%.3f  mu=%.3f  EG: %zu it, up %.3g, all %.3g bits\n", h,
                p->lipschitz(), p->mean_square_lipschitz(), p->mu(), eg->iterations, up_eg, all_eg);
    std::printf("  EG/method bit ratios (up/all) for gamma = c * recommended\n");
    for (std::size_t k : {std::size_t{2}, std::size_t{10}, std::size_t{20}}) {
      for (auto v : {variant{"masha1 rand-k, server rand-k", method_kind::masha1,
                             codec_kind::rand_k, codec_kind::rand_k, false},
                     variant{"masha1 rand-k, server dense", method_kind::masha1, codec_kind::rand_k,
                             codec_kind::dense, false},
                     variant{"masha1 rand-k, shared seed", method_kind::masha1, codec_kind::rand_k,
                             codec_kind::rand_k, true},
                     variant{"masha2 top-k, server top-k", method_kind::masha2, codec_kind::top_k,
                             codec_kind::top_k, false}}) {
        std::printf("  k=%-3zu %-30s", k, v.name);
        for (double c : {0.5, 1.0, 2.0, 4.0}) {
          method_options o;
          o.method = v.method;
          o.worker_codec = {v.worker, k};
          o.server_codec = {v.server, k};
          o.shared_randomness = v.shared;
          o = recommended_options(o, *p, c);
          auto res = run_pure(p, o, {200000, 1e-6});
          if (!res.ok() || !res->reached) {
            std::printf("  c=%-3g     --     ", c);
            continue;
          }
          const double up = res->trace.back().bits_up;
          const double all = up + res->trace.back().bits_down;
          std::printf("  c=%-3g %5.2f/%5.2f", c, up_eg / up, all_eg / all);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
}
