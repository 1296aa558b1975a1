// A 64-bit hash of text that is the same in every build and on every node (FNV-1a): for seeds,
// ids and choices that several processes must agree on (std::hash may differ between builds).
#pragma once

#include <cstdint>
#include <string_view>

namespace starling::kernels {

inline uint64_t stable_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

} // namespace starling::kernels
