# Membership of a run: tokens the run's authority signs, its deny list, and the hello a node
# presents before any other message. Every signed object is a pair (body bytes, signature) so the
# signature covers the exact bytes that were sent, never a re-encoding. Decoders in
# actors/auth check every field (sizes, counts, names, times) before any use.
@0xc1f2a7be3d4e5f60;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

struct TokenBody {
  formatVersion @0 :UInt16;   # 1
  tokenId @1 :Data;           # 16 random bytes; deny lists name a token by it
  peerKey @2 :Data;           # the holder's 32-byte Ed25519 public key
  roles @3 :List(Text);       # role names ([a-z0-9_-], 1..32 chars, at most 16), or just "any"
  experimentId @4 :Text;      # the run the token admits to (1..128 bytes)
  issuedAtNs @5 :Int64;       # Unix time in nanoseconds
  expiresAtNs @6 :Int64;      # Unix time in nanoseconds, after issuedAtNs
  authorityKey @7 :Data;      # the signer's 32-byte public key
}

# A signed object: the exact bytes of its body and an Ed25519 signature over a domain string
# (naming what the body is, so one kind is never taken for another) followed by the body:
#   token      "starling.token.v1"  body = TokenBody,     signed by the authority
#   deny list  "starling.deny.v1"   body = DenyListBody,  signed by the authority
#   hello      "starling.hello.v1"  body = HelloBody,     signed by the node key
struct Signed {
  body @0 :Data;              # one Cap'n Proto flat array
  signature @1 :Data;         # 64 bytes
}

struct DenyEntry {
  kind @0 :UInt8;             # 0: a token (id = token id); 1: a peer (id = public key), a ban
  id @1 :Data;
  reason @2 :Text;            # one line, at most 256 bytes
  addedAtNs @3 :Int64;
  untilNs @4 :Int64;          # 0: for ever
}

struct DenyListBody {
  formatVersion @0 :UInt16;   # 1
  experimentId @1 :Text;
  serial @2 :UInt64;          # a node keeps the verified list of the highest serial it saw
  issuedAtNs @3 :Int64;
  entries @4 :List(DenyEntry);  # at most 65536
  authorityKey @5 :Data;
}

# A node's introduction on a new connection, answering the acceptor's challenge: who it is
# (its node key), what it may do (its token; empty in an open run), bound to this connection
# (the challenge and the acceptor's peer id) and signed by the node key.
struct HelloBody {
  protocolVersion @0 :UInt16;
  experimentId @1 :Text;
  peerKey @2 :Data;           # 32 bytes
  token @3 :Data;             # a Signed token as a flat array; empty when the run is open
  challenge @4 :Data;         # the acceptor's nonce for this connection (16..64 bytes)
  acceptorPeerId @5 :Data;    # 20 bytes
  timeNs @6 :Int64;           # the sender's clock
}
