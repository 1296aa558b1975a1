// How an actor of a node hands the node a ban it verified itself (BTARD's verdicts are decided by
// the peers, not signed by the authority). `actors/` does not depend on `runtime/`: the node
// publishes its gate in its directory under the name `gate` (runtime/node/gate.hpp), and an actor
// of the same node sends it
//
//   (verified_ban_atom, node key (32-byte Ed25519 public key), reason) -> uint64_t
//
// The gate bans the key beside the authority's deny list (`admission::ban_verified`): the peer
// admitted with that key loses its session and its directory access, and its later hellos and
// envelopes are refused as `banned` and counted; the answer is how many admitted peers it
// removed. The gate refuses the message from another node (a remote peer could silence anyone).
// The node's DHT actor takes `(actors::dht::ban_atom, key)` likewise (actors/dht/dht.hpp), so
// that the banned key's records are dropped, refused and no longer read.
#pragma once

#include <caf/atom.hpp>

namespace starling::actors::auth {

/// See the file comment.
using verified_ban_atom = caf::atom_constant<caf::atom("vban")>;

/// Node keys are Ed25519 public keys.
inline constexpr size_t verified_ban_key_bytes = 32;
/// A ban's reason is one line of at most this many bytes.
inline constexpr size_t verified_ban_reason_bytes = 512;

} // namespace starling::actors::auth
