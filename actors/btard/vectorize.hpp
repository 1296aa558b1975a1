// How the BTARD hot loops (CenteredClip, projections) are compiled: an AVX2 clone beside the
// baseline x86-64 one, picked at load time, and GCC's dynamic vectorizer cost model (-O2's "very
// cheap" model skips loops that need an epilogue). Both clones compute the same bits: reductions
// run in explicit lanes (the order is fixed in the source, not chosen by the vectorizer), and
// neither target has FMA, so no product and sum are contracted into one rounding. Internal to
// actors/btard. Not under ThreadSanitizer (see kernels/compress/detail/loops.cpp).
#pragma once

#include <cstddef>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define STARLING_BTARD_VECTORIZE                                                                   \
  __attribute__((target_clones("avx2", "default"), optimize("vect-cost-model=dynamic")))
#else
#define STARLING_BTARD_VECTORIZE
#endif

namespace starling::actors::btard::detail {

/// Partial sums of the BTARD reductions: element k of a vector goes to lane k mod 8, each lane
/// sums in index order, and the lanes are added in order 0..7 at the end.
inline constexpr size_t sum_lanes = 8;

/// The lanes' total, in lane order.
inline double lane_total(const double* lane) {
  double s = 0.0;
  for (size_t l = 0; l < sum_lanes; ++l)
    s += lane[l];
  return s;
}

} // namespace starling::actors::btard::detail
