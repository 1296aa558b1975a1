// Small message types used by the runtime itself (liveness, raw payloads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include "messages/enveloped.hpp"

namespace starling::messages {

/// Liveness probe between nodes; `seq` is echoed back, `origin` names the sender node.
struct ping_msg {
  uint64_t seq = 0;
  std::string origin;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<ping_msg> {
  static constexpr const char* name = "ping";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const ping_msg& x);
  static status read(const payload_reader& r, ping_msg& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ping_msg& x) {
  return inspect_enveloped(f, x, "ping_msg", [&] {
    return f(caf::meta::type_name("ping_msg"), x.seq, x.origin);
  });
}

/// An opaque byte payload (e.g. a Cap'n Proto flat array) with a tag naming its schema.
struct blob_msg {
  std::string tag;
  std::vector<char> bytes;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<blob_msg> {
  static constexpr const char* name = "blob";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const blob_msg& x);
  static status read(const payload_reader& r, blob_msg& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, blob_msg& x) {
  return inspect_enveloped(f, x, "blob_msg", [&] {
    return f(caf::meta::type_name("blob_msg"), x.tag, x.bytes);
  });
}

} // namespace starling::messages
