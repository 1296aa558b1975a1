# The DHT protocol (messages/dht.hpp): Kademlia RPCs between nodes and the client API of a node's
# DHT actor. Keys, sub-keys, ids and values are Data (any bytes); addresses are Text.
@0x8382ec9b3e535b78;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

struct DhtPeer {
  id @0 :Data;              # 20 bytes, or empty when unknown
  address @1 :Text;         # host:port/name, at most 512 bytes
}

struct DhtRecord {
  key @0 :Data;             # at most 4 KiB
  hasSubkey @1 :Bool;
  subkey @2 :Data;          # at most 4 KiB
  value @3 :Data;           # at most 1 MiB (a node's store limit is lower)
  expirationNs @4 :Int64;
  signature @5 :Data;       # empty or 64 bytes
}

struct DhtRequest {
  kind @0 :UInt8;           # 0 ping, 1 store, 2 find_node, 3 find_value
  sender @1 :DhtPeer;
  target @2 :Data;          # find_node: 20 bytes
  key @3 :Data;             # find_value
  records @4 :List(DhtRecord);  # store: at most 1024
}

struct DhtResponse {
  responder @0 :DhtPeer;
  closer @1 :List(DhtPeer);     # at most 256
  records @2 :List(DhtRecord);  # at most 1024
  accepted @3 :Data;            # store: one byte (0 or 1) per record
  refused @4 :Text;             # at most 1 KiB
}

struct DhtPut {
  key @0 :Data;
  hasSubkey @1 :Bool;
  subkey @2 :Data;
  value @3 :Data;
  expirationNs @4 :Int64;
  sign @5 :Bool;
}

struct DhtPutResult {
  accepted @0 :UInt32;
  replicas @1 :UInt32;
  hops @2 :UInt32;
}

struct DhtGetResult {
  found @0 :Bool;
  records @1 :List(DhtRecord);
  hops @2 :UInt32;
}

struct DhtStats {
  records @0 :UInt64;
  peers @1 :UInt64;
  rejectedTooLarge @2 :UInt64;
  rejectedStoreFull @3 :UInt64;
  rejectedOlder @4 :UInt64;
  rejectedExpired @5 :UInt64;
  rejectedBadSignature @6 :UInt64;
  rejectedRateLimit @7 :UInt64;
  evictedPeers @8 :UInt64;
  rejectedBanned @9 :UInt64;
}

struct DhtMessage {
  union {
    request @0 :DhtRequest;
    response @1 :DhtResponse;
    put @2 :DhtPut;
    putResult @3 :DhtPutResult;
    getResult @4 :DhtGetResult;
    stats @5 :DhtStats;
    peer @6 :DhtPeer;
    record @7 :DhtRecord;
  }
}
