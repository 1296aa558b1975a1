// BTARD part digests: a public function of a part's values, so that a peer can commit to what it
// will send before any chunk leaves, and a receiver can check what arrived against that
// commitment. The values' little-endian float32 bytes are cut into 128-byte blocks dealt round
// robin to four leaves (block b to leaf b mod 4), each leaf the standard BLAKE2b-256 of its
// blocks (leaf_hash.hpp); the digest is BLAKE2b-256 (libsodium's crypto_generichash) of a domain
// tag, the step, the part index, the element count and the four leaves. The four leaves run four
// at a time in AVX2 registers, at about four times the rate of libsodium's BLAKE2b here
// (each peer hashes about three times the model per step: its own parts, the parts it
// aggregates and the results it receives); collisions need a BLAKE2b collision in a leaf or the
// root. The digest depends on the values only, never on how the transport cuts them into
// chunks: `part_hasher` takes the chunks in any cut and any arrival order and yields the digest
// of the whole part. A digest can only be checked once the part is complete (a chunk alone
// proves nothing). No CAF, no LibTorch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::btard {

/// Bytes of every BTARD digest (BLAKE2b-256).
inline constexpr size_t digest_bytes = 32;

/// A BLAKE2b-256 digest.
using digest = std::array<uint8_t, digest_bytes>;

/// Largest part in elements a digest is computed for (2^40: far above any model, and keeps
/// offsets and byte counts far from overflow).
inline constexpr uint64_t max_part_elems = uint64_t{1} << 40;

/// The digest of part `part` of step `step` holding `count` values (`values` may be null when
/// `count` is 0).
digest part_digest(uint64_t step, uint64_t part, const float* values, size_t count);

/// `part_digest` of a whole vector.
digest part_digest(uint64_t step, uint64_t part, const std::vector<float>& values);

/// BLAKE2b-256 of `bytes` (a helper for the other BTARD cores; not a part digest).
digest hash_bytes(std::string_view bytes);

/// The digest's 32 bytes as a string (for encodings and map keys).
std::string digest_string(const digest& d);

/// The digest held by a 32-byte string; fails on any other size.
result<digest> digest_of_string(std::string_view bytes);

/// Lowercase hex of a digest, for logs and the audit file.
std::string digest_hex(const digest& d);

/// Streaming `part_digest`: chunks of the part arrive at their offsets, in any cut and any
/// order; the digest of the whole part comes out at the end, equal to `part_digest` of the same
/// values. Chunks that arrive ahead of a gap are copied and kept until the gap is filled (at most
/// the part's size in all). A chunk that overlaps one already added, or reaches past the part's
/// end, is refused and changes nothing.
class part_hasher {
public:
  /// A hasher for part `part` of step `step` of `count` values (`count` <= `max_part_elems`,
  /// else every `add` and `finish` fails).
  part_hasher(uint64_t step, uint64_t part, uint64_t count);
  ~part_hasher();
  part_hasher(part_hasher&&) noexcept;
  part_hasher& operator=(part_hasher&&) noexcept;
  part_hasher(const part_hasher&) = delete;
  part_hasher& operator=(const part_hasher&) = delete;

  /// Adds `n` values that start at element `offset` of the part.
  status add(uint64_t offset, const float* values, size_t n);

  /// Values added so far (hashed or waiting for a gap to fill).
  uint64_t received() const noexcept { return received_; }

  /// Values hashed so far: every value before this offset has arrived.
  uint64_t contiguous() const noexcept { return next_; }

  /// True when every value of the part has arrived.
  bool complete() const noexcept { return received_ == count_ && next_ == count_; }

  /// The part's digest; fails (naming what is missing) unless `complete()`, and when called twice.
  result<digest> finish();

private:
  struct state;
  void feed(const float* values, size_t n);

  std::unique_ptr<state> state_;
  uint64_t count_ = 0;
  uint64_t next_ = 0;
  uint64_t received_ = 0;
  bool finished_ = false;
  /// Chunks ahead of `next_`, by offset.
  std::map<uint64_t, std::vector<float>> pending_;
};

} // namespace starling::actors::btard
