// Messages of the MASHA / extragradient protocol (actors/vi): compressed flat vectors between
// workers and the server. Plain structs; CAF only sees them through `inspect`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include "messages/enveloped.hpp"

namespace starling::messages {

/// How a `vi_vector` is encoded. The receiver decodes by this tag alone, so it needs no codec state.
enum class vi_codec : uint8_t {
  /// All `dim` values travel as float32.
  dense = 0,
  /// k values travel; their indices are k distinct draws from `seed`; decode scales by dim/k.
  rand_k = 1,
  /// k (index, value) pairs travel: the k largest magnitudes (plus error feedback upstream).
  top_k = 2,
};

/// A flat vector as it travels: codec, length, and only what the codec needs.
/// Bits counted (see `payload_bits`): values 32 each, indices 32 each, seed 64. `codec` and `dim`
/// are fixed per run by the configuration both sides share, so they carry no information and
/// are not counted.
struct vi_vector {
  uint8_t codec = 0;
  uint32_t dim = 0;
  uint64_t seed = 0;
  std::vector<uint32_t> indices;
  std::vector<float> values;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

/// Exact payload bits of a `vi_vector`, as defined above.
inline uint64_t payload_bits(const vi_vector& v) {
  return 32u * v.values.size() + 32u * v.indices.size()
         + (v.codec == static_cast<uint8_t>(vi_codec::rand_k) ? 64u : 0u);
}

template <>
struct wire_codec<vi_vector> {
  static constexpr const char* name = "vi.vector";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const vi_vector& x);
  static status read(const payload_reader& r, vi_vector& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vi_vector& x) {
  return inspect_enveloped(f, x, "vi_vector", [&] {
    return f(caf::meta::type_name("vi_vector"), x.codec, x.dim, x.seed, x.indices, x.values);
  });
}

/// What kind of round a message belongs to; both ends check that they agree.
enum class vi_phase : uint8_t {
  /// Uncompressed operator values at the reference point w (MASHA) — the initial round and every
  /// round after a coin flip of 1.
  full = 0,
  /// Compressed operator differences (MASHA1/MASHA2).
  compressed = 1,
  /// Extragradient: operator at z.
  eg_point = 2,
  /// Extragradient: operator at the extrapolated point z_{k+1/2}.
  eg_half = 3,
};

/// Worker → server: the worker's contribution to one round.
struct vi_uplink {
  uint32_t worker = 0;
  uint64_t round = 0;
  uint8_t phase = 0;
  vi_vector payload;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<vi_uplink> {
  static constexpr const char* name = "vi.uplink";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const vi_uplink& x);
  static status read(const payload_reader& r, vi_uplink& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vi_uplink& x) {
  return inspect_enveloped(f, x, "vi_uplink", [&] {
    return f(caf::meta::type_name("vi_uplink"), x.worker, x.round, x.phase, x.payload);
  });
}

/// Server → every worker: the aggregate of one round and, for compressed MASHA rounds, the shared
/// coin deciding whether the reference point w moves (counted as 1 bit).
struct vi_downlink {
  uint64_t round = 0;
  uint8_t phase = 0;
  bool coin = false;
  vi_vector payload;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

/// Exact payload bits of a downlink: its vector plus the coin bit in compressed rounds.
inline uint64_t payload_bits(const vi_downlink& d) {
  return payload_bits(d.payload) + (d.phase == static_cast<uint8_t>(vi_phase::compressed) ? 1u : 0u);
}

template <>
struct wire_codec<vi_downlink> {
  static constexpr const char* name = "vi.downlink";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const vi_downlink& x);
  static status read(const payload_reader& r, vi_downlink& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vi_downlink& x) {
  return inspect_enveloped(f, x, "vi_downlink", [&] {
    return f(caf::meta::type_name("vi_downlink"), x.round, x.phase, x.coin, x.payload);
  });
}

} // namespace starling::messages

namespace starling::messages {

/// The outcome of a run of the vi actors: what the server (and worker 0's replica) ended with.
struct vi_report {
  /// Iterations completed.
  uint64_t iterations = 0;
  /// Final z of the first live worker (every replica is identical).
  std::vector<double> z;
  /// Payload bits that worker sent.
  uint64_t bits_up = 0;
  /// Payload bits that worker received.
  uint64_t bits_down = 0;
  /// Workers still alive at the end.
  uint32_t live_workers = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<vi_report> {
  static constexpr const char* name = "vi.report";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const vi_report& x);
  static status read(const payload_reader& r, vi_report& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vi_report& x) {
  return inspect_enveloped(f, x, "vi_report", [&] {
    return f(caf::meta::type_name("vi_report"), x.iterations, x.z, x.bits_up, x.bits_down,
             x.live_workers);
  });
}

} // namespace starling::messages
