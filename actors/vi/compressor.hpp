// Compressors for MASHA on flat double vectors: what a sender turns a vector into on the wire and
// what the receiver decodes. Pure C++, no CAF.
#pragma once

#include <cstddef>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "messages/vi.hpp"

namespace starling::actors::vi {

/// A flat vector compressed for sending: the wire form and the vector the receiver will decode.
struct compressed {
  /// Exactly what travels.
  messages::vi_vector wire;
  /// `decode(wire)`: the sender needs it for error feedback, tests for checking.
  std::vector<double> seen;
  /// Payload bits of `wire`.
  uint64_t bits = 0;
};

/// The compressor interface MASHA needs: vector in, wire form + decoded vector + bits out.
class vector_compressor {
public:
  virtual ~vector_compressor() = default;
  /// Compresses `v`; randomized compressors draw from `rng` (seeded by the caller).
  virtual compressed compress(const std::vector<double>& v, std::mt19937_64& rng) const = 0;
  /// True when E[Q(v)] = v (MASHA1 needs this; MASHA2 works with contractive ones).
  virtual bool unbiased() const = 0;
  /// For unbiased compressors the q with E‖Q(v)‖² ≤ q‖v‖²; for contractive ones the δ with
  /// ‖C(v) − v‖² ≤ (1 − δ)‖v‖². Both for vectors of length `dim`.
  virtual double parameter(std::size_t dim) const = 0;
  /// Short name for tables ("rand-k(20)").
  virtual std::string name() const = 0;
};

/// No compression: all values as float32 (q = 1, δ = 1).
std::unique_ptr<vector_compressor> make_dense();

/// Rand-k: k coordinates drawn without replacement from a fresh 64-bit seed, scaled by dim/k so the
/// result is unbiased; q = dim/k. Only the seed and k values travel.
std::unique_ptr<vector_compressor> make_rand_k(std::size_t k);

/// Top-k: the k largest magnitudes (ties to the lower index, so it is deterministic); contractive
/// with δ = k/dim; k indices and k values travel.
std::unique_ptr<vector_compressor> make_top_k(std::size_t k);

/// The k distinct indices in [0, dim) that Rand-k derives from `seed` (sender and receiver alike).
std::vector<uint32_t> rand_k_indices(uint64_t seed, std::size_t dim, std::size_t k);

/// Decodes a received vector, checking it against the length the protocol expects; a malformed
/// vector (wrong length, unknown codec, index out of range, k > dim) is a failure, never a crash.
result<std::vector<double>> decode(const messages::vi_vector& v, std::size_t expected_dim);

} // namespace starling::actors::vi
