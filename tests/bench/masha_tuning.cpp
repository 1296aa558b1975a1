// Scans MASHA's step-size multiplier and the problem's heterogeneity: bits per worker to reach
// relative error 1e-6, and the ratio to extragradient's. Prints a table; asserts nothing.
#include <cstdio>
#include <memory>

#include "actors/vi/masha.hpp"

using namespace starling::actors::vi;

int main() {
  for (double h : {0.1, 0.5, 1.0, 3.0}) {
    bilinear_options bo;
    bo.heterogeneity = h;
    auto p = std::make_shared<const bilinear_problem>(*bilinear_problem::make(bo));
    auto eg = run_pure(p, recommended_options(method_kind::extragradient, *p, {}, {}),
                       {100000, 1e-6});
    const double b_eg = eg->trace.back().bits_up + eg->trace.back().bits_down;
    std::printf("h=%.1f  L=%.3f  L~=%.3f  mu=%.3f  EG: %zu it, %.3g bits\n", h, p->lipschitz(),
                p->mean_square_lipschitz(), p->mu(), eg->iterations, b_eg);
    for (std::size_t k : {2, 20}) {
      struct row {
        const char* name;
        method_kind m;
        codec_spec w, s;
      };
      for (auto r : {row{"masha1 rand-k", method_kind::masha1, {codec_kind::rand_k, k},
                         {codec_kind::rand_k, k}},
                     row{"masha1 rand-k, server dense", method_kind::masha1,
                         {codec_kind::rand_k, k}, {codec_kind::dense, 0}},
                     row{"masha2 top-k", method_kind::masha2, {codec_kind::top_k, k},
                         {codec_kind::top_k, k}}}) {
        std::printf("  k=%-3zu %-28s", k, r.name);
        for (double c : {0.5, 1.0, 2.0, 4.0, 8.0}) {
          auto o = recommended_options(r.m, *p, r.w, r.s, 1, c);
          auto res = run_pure(p, o, {400000, 1e-6});
          if (!res.ok() || !res->reached) {
            std::printf("  c=%-3g    --   ", c);
            continue;
          }
          const double b = res->trace.back().bits_up + res->trace.back().bits_down;
          std::printf("  c=%-3g %6.2fx", c, b_eg / b);
        }
        std::printf("\n");
      }
    }
  }
}
