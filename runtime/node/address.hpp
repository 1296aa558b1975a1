// The address of a peer: its node's endpoint plus the name its actor is registered under.
#pragma once

#include <cstdint>
#include <optional>
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

/// `@<node>/<name>`: an actor of node `<node>` of the running experiment, whatever its endpoint
/// (hosts translate it: the simulation by node index, a cluster through the run's node table).
struct instance_address {
  /// The node index; -1 for `@open/<name>` (a volunteer slot, found through the DHT).
  long node = 0;
  std::string name;

  /// Parses `@<node>/<name>` or `@open/<name>`; nothing when `text` is not of that form.
  static std::optional<instance_address> parse(const std::string& text);
};

} // namespace starling::runtime
