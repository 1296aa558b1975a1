// Small helpers shared by the payload codecs (*_codec.cpp): bytes in and out of Cap'n Proto
// Data/Text, and size checks that say what was expected and what came.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <capnp/blob.h>

#include "kernels/result.hpp"

namespace starling::messages::codec {

/// A Data reader over a string's bytes.
inline capnp::Data::Reader data(const std::string& s) {
  return {reinterpret_cast<const kj::byte*>(s.data()), s.size()};
}

/// A Data reader over a byte vector.
inline capnp::Data::Reader data(const std::vector<char>& v) {
  return {reinterpret_cast<const kj::byte*>(v.data()), v.size()};
}

/// A Text reader over a string (Cap'n Proto adds the NUL).
inline capnp::Text::Reader text(const std::string& s) {
  return {s.data(), s.size()};
}

/// Fails when `n > max`, naming the field.
inline status at_most(const char* field, size_t n, size_t max) {
  if (n > max)
    return fail(std::string{field} + " has " + std::to_string(n) + " bytes or elements, at most "
                + std::to_string(max));
  return {};
}

/// Copies a Data field of at most `max` bytes into `out`.
inline status get(capnp::Data::Reader d, const char* field, size_t max, std::string& out) {
  if (auto st = at_most(field, d.size(), max); !st)
    return st;
  out.assign(reinterpret_cast<const char*>(d.begin()), d.size());
  return {};
}

/// Copies a Data field of at most `max` bytes into `out`.
inline status get(capnp::Data::Reader d, const char* field, size_t max, std::vector<char>& out) {
  if (auto st = at_most(field, d.size(), max); !st)
    return st;
  out.assign(reinterpret_cast<const char*>(d.begin()),
             reinterpret_cast<const char*>(d.begin()) + d.size());
  return {};
}

/// Copies a Text field of at most `max` bytes into `out`.
inline status get(capnp::Text::Reader t, const char* field, size_t max, std::string& out) {
  if (auto st = at_most(field, t.size(), max); !st)
    return st;
  out.assign(t.begin(), t.size());
  return {};
}

/// Fails unless `v` is at most `max` (an enumeration or a bounded count).
inline status within(const char* field, uint64_t v, uint64_t max) {
  if (v > max)
    return fail(std::string{field} + " is " + std::to_string(v) + ", at most "
                + std::to_string(max));
  return {};
}

/// Fails unless `v` lies in [lo, hi].
inline status within(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return fail(std::string{field} + " is " + std::to_string(v) + ", expected "
                + std::to_string(lo) + " .. " + std::to_string(hi));
  return {};
}

/// Fails unless `v` is finite and at least `lo`.
inline status finite_at_least(const char* field, double v, double lo) {
  if (!std::isfinite(v) || v < lo)
    return fail(std::string{field} + " is " + std::to_string(v) + ", expected a finite value >= "
                + std::to_string(lo));
  return {};
}

/// Longest address, group key or similar name on the wire.
inline constexpr size_t max_name_bytes = 512;
/// Longest free-text reason or detail on the wire.
inline constexpr size_t max_reason_bytes = 4096;

} // namespace starling::messages::codec

/// Returns the failure of a status-returning expression.
#define STARLING_TRY(expr)                                                                         \
  do {                                                                                             \
    if (auto starling_try_st_ = (expr); !starling_try_st_)                                         \
      return starling_try_st_;                                                                     \
  } while (false)
