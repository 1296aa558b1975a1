// Small message types used by the runtime itself (liveness, raw payloads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace starling::messages {

/// Liveness probe between nodes; `seq` is echoed back, `origin` names the sender node.
struct ping_msg {
  uint64_t seq = 0;
  std::string origin;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ping_msg& x) {
  return f(caf::meta::type_name("ping_msg"), x.seq, x.origin);
}

/// An opaque byte payload (e.g. a Cap'n Proto flat array) with a tag naming its schema.
struct blob_msg {
  std::string tag;
  std::vector<char> bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, blob_msg& x) {
  return f(caf::meta::type_name("blob_msg"), x.tag, x.bytes);
}

} // namespace starling::messages
