// The address of a peer: its node's endpoint plus the name its actor is registered under.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/result.hpp"

namespace starling::runtime {

/// `host:port/name` — what the DHT stores for a peer and what the resolver turns into a handle.
struct peer_address {
  std::string host;
  uint16_t port = 0;
  std::string name;

  /// `host:port/name`.
  std::string to_string() const;
  /// `host:port` of the node.
  std::string endpoint() const;
  /// Parses `host:port/name` (name non-empty, port in [1, 65535]).
  static result<peer_address> parse(const std::string& text);

  friend bool operator==(const peer_address& a, const peer_address& b) {
    return a.host == b.host && a.port == b.port && a.name == b.name;
  }
};

} // namespace starling::runtime
