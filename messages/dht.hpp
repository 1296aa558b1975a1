// Message types of the Kademlia DHT: the peer-to-peer RPC (one request and one response type for
// ping, store, find_node and find_value) and the client API of a node's DHT actor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "messages/enveloped.hpp"

namespace starling::messages {

/// A DHT peer as others see it: its 20-byte id and its address (`host:port/name`).
struct dht_peer {
  std::string id;
  std::string address;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_peer> {
  static constexpr const char* name = "dht.peer";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_peer& x);
  static status read(const payload_reader& r, dht_peer& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_peer& x) {
  return inspect_enveloped(f, x, "dht_peer", [&] {
    return f(caf::meta::type_name("dht_peer"), x.id, x.address);
  });
}

/// One stored value: a plain record (`has_subkey == false`) or one sub-key of a dictionary
/// record. `expiration_ns` is absolute DHT time; `signature` is an Ed25519 signature of the
/// record's fields by the owner named in an owned key or sub-key (empty when not owned).
struct dht_record {
  std::string key;
  bool has_subkey = false;
  std::string subkey;
  std::vector<char> value;
  int64_t expiration_ns = 0;
  std::string signature;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_record> {
  static constexpr const char* name = "dht.record";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_record& x);
  static status read(const payload_reader& r, dht_record& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_record& x) {
  return inspect_enveloped(f, x, "dht_record", [&] {
    return f(caf::meta::type_name("dht_record"), x.key, x.has_subkey, x.subkey, x.value,
             x.expiration_ns, x.signature);
  });
}

/// What a `dht_request` asks for.
enum class dht_rpc : uint8_t { ping = 0, store = 1, find_node = 2, find_value = 3 };

/// A DHT RPC. Every request names its sender so that the receiver learns about it.
struct dht_request {
  uint8_t kind = 0;
  dht_peer sender;
  /// find_node: the 20-byte target id.
  std::string target;
  /// find_value: the key.
  std::string key;
  /// store: the records to store.
  std::vector<dht_record> records;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_request> {
  static constexpr const char* name = "dht.request";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_request& x);
  static status read(const payload_reader& r, dht_request& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_request& x) {
  return inspect_enveloped(f, x, "dht_request", [&] {
    return f(caf::meta::type_name("dht_request"), x.kind, x.sender, x.target, x.key, x.records);
  });
}

/// The answer to a `dht_request`.
struct dht_response {
  dht_peer responder;
  /// find_node / find_value: the closest peers the responder knows.
  std::vector<dht_peer> closer;
  /// find_value: the live records held for the key (one per sub-key for dictionaries).
  std::vector<dht_record> records;
  /// store: one flag per stored record (1 = accepted).
  std::vector<uint8_t> accepted;
  /// Non-empty when the request was refused as a whole (e.g. rate limit).
  std::string refused;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_response> {
  static constexpr const char* name = "dht.response";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_response& x);
  static status read(const payload_reader& r, dht_response& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_response& x) {
  return inspect_enveloped(f, x, "dht_response", [&] {
    return f(caf::meta::type_name("dht_response"), x.responder, x.closer, x.records, x.accepted,
             x.refused);
  });
}

/// Client API: store one record (a value or one sub-key) at the key's closest peers. The DHT
/// actor signs it with its own identity when `sign` is set. Reply: `dht_put_result`.
struct dht_put {
  std::string key;
  bool has_subkey = false;
  std::string subkey;
  std::vector<char> value;
  int64_t expiration_ns = 0;
  bool sign = false;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_put> {
  static constexpr const char* name = "dht.put";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_put& x);
  static status read(const payload_reader& r, dht_put& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_put& x) {
  return inspect_enveloped(f, x, "dht_put", [&] {
    return f(caf::meta::type_name("dht_put"), x.key, x.has_subkey, x.subkey, x.value, x.expiration_ns,
             x.sign);
  });
}

/// Reply to `dht_put`: how many replicas accepted the record and how many lookup hops it took.
struct dht_put_result {
  uint32_t accepted = 0;
  uint32_t replicas = 0;
  uint32_t hops = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_put_result> {
  static constexpr const char* name = "dht.put_result";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_put_result& x);
  static status read(const payload_reader& r, dht_put_result& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_put_result& x) {
  return inspect_enveloped(f, x, "dht_put_result", [&] {
    return f(caf::meta::type_name("dht_put_result"), x.accepted, x.replicas, x.hops);
  });
}

/// Reply to a client get: the live records found (empty = not found) and the hops it took.
struct dht_get_result {
  bool found = false;
  std::vector<dht_record> records;
  uint32_t hops = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_get_result> {
  static constexpr const char* name = "dht.get_result";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_get_result& x);
  static status read(const payload_reader& r, dht_get_result& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_get_result& x) {
  return inspect_enveloped(f, x, "dht_get_result", [&] {
    return f(caf::meta::type_name("dht_get_result"), x.found, x.records, x.hops);
  });
}

/// Counters of a DHT node (limits hit, rejections), returned for `(status_atom)`.
struct dht_stats {
  uint64_t records = 0;
  uint64_t peers = 0;
  uint64_t rejected_too_large = 0;
  uint64_t rejected_store_full = 0;
  uint64_t rejected_older = 0;
  uint64_t rejected_expired = 0;
  uint64_t rejected_bad_signature = 0;
  uint64_t rejected_rate_limit = 0;
  uint64_t evicted_peers = 0;
  /// Writes of records signed by a signer this node banned.
  uint64_t rejected_banned = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<dht_stats> {
  static constexpr const char* name = "dht.stats";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const dht_stats& x);
  static status read(const payload_reader& r, dht_stats& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dht_stats& x) {
  return inspect_enveloped(f, x, "dht_stats", [&] {
    return f(caf::meta::type_name("dht_stats"), x.records, x.peers, x.rejected_too_large,
             x.rejected_store_full, x.rejected_older, x.rejected_expired, x.rejected_bad_signature,
             x.rejected_rate_limit, x.evicted_peers, x.rejected_banned);
  });
}

} // namespace starling::messages
