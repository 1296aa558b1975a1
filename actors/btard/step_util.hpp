// Small pieces both BTARD engines use: the lockstep group (protocol.cpp) and the one-peer core
// (peer_core.cpp) must compute the same secrets, the same finite checks and the same update, or
// their runs would not agree bit for bit (peer_core_test compares them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "actors/btard/clip.hpp"
#include "actors/btard/digest.hpp"
#include "actors/btard/protocol.hpp"

namespace starling::actors::auth {
class key_pair;
} // namespace starling::actors::auth

namespace starling::actors::btard {

/// `v` as 8 little-endian bytes.
std::string le64(uint64_t v);

/// A flat float tensor over `v`'s storage (no copy: `v` must outlive it).
at::Tensor as_tensor(const std::vector<float>& v);

/// A tensor's values as a flat float vector.
std::vector<float> as_vector(const at::Tensor& t);

/// Whether every value is finite: no CenteredClip, projection or update may read a NaN or an
/// infinity (a NaN would poison the median and every distance, so one peer could stop a run).
bool finite_values(const float* v, size_t n);

/// Adds one CenteredClip's statistics to its attempt's record.
void note_clip(attempt_record& rec, const clip_outcome& c, size_t inputs);

/// The MPRNG secret of the peer with key `key` at (step, attempt): derived from its private seed,
/// so nobody else can compute it before the reveal.
digest mprng_secret(const auth::key_pair& key, uint64_t step, uint32_t attempt);

/// SGD with Nesterov momentum on `size` values at `begin`: v ← μv + g; θ ← θ − lr·(g + μv).
void nesterov_step(std::vector<float>& params, std::vector<float>& velocity, size_t begin,
                   const float* g, size_t size, double lr, double momentum);

} // namespace starling::actors::btard
