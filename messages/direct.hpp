// Messages of the direct data channel (actors/transfer/data_channel.hpp): the control plane of a
// bulk transfer whose bytes stream over a loopback TCP connection beside BASP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include "messages/enveloped.hpp"

namespace starling::messages {

/// Sender → receiver: "a tensor of this header and size will arrive on your data endpoint with
/// this token". The receiver answers with a `direct_endpoint` or an error (too large, bad token).
struct direct_announce {
  /// A random one-time token (16 bytes) the data connection must present.
  std::vector<char> token;
  /// Bytes of the encoded Cap'n Proto `Tensor` that will follow the frame header.
  uint64_t total_bytes = 0;
  /// kernels::wire_dtype of the tensor.
  uint8_t dtype = 0;
  /// Shape of the tensor.
  std::vector<int64_t> shape;
  /// kernels::codec_id of the payload.
  uint8_t codec = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<direct_announce> {
  static constexpr const char* name = "transfer.announce";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const direct_announce& x);
  static status read(const payload_reader& r, direct_announce& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, direct_announce& x) {
  return inspect_enveloped(f, x, "direct_announce", [&] {
    return f(caf::meta::type_name("direct_announce"), x.token, x.total_bytes, x.dtype, x.shape,
             x.codec);
  });
}

/// Where a receiver takes direct transfers; `port == 0` means it has no data endpoint (the
/// sender then uses BASP chunks).
struct direct_endpoint {
  /// IPv4 loopback address (127.0.0.0/8).
  std::string host;
  /// TCP port; 0 when there is no data endpoint.
  uint16_t port = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<direct_endpoint> {
  static constexpr const char* name = "transfer.endpoint";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const direct_endpoint& x);
  static status read(const payload_reader& r, direct_endpoint& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, direct_endpoint& x) {
  return inspect_enveloped(f, x, "direct_endpoint", [&] {
    return f(caf::meta::type_name("direct_endpoint"), x.host, x.port);
  });
}

/// A transfer sender's reply: bytes moved and the path they took.
struct transfer_report {
  /// Encoded payload bytes delivered.
  uint64_t bytes = 0;
  /// "direct" (the data channel) or "chunked" (BASP chunks).
  std::string path;
  /// Why the chunk path was used instead of the data channel; empty for "direct".
  std::string fallback_reason;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<transfer_report> {
  static constexpr const char* name = "transfer.report";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const transfer_report& x);
  static status read(const payload_reader& r, transfer_report& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, transfer_report& x) {
  return inspect_enveloped(f, x, "transfer_report", [&] {
    return f(caf::meta::type_name("transfer_report"), x.bytes, x.path, x.fallback_reason);
  });
}

} // namespace starling::messages
