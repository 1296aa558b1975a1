// A DHT node's local store of expiring records: plain values and dictionaries whose sub-keys
// expire independently, with size and count limits and signature checks (no CAF).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "messages/dht.hpp"

namespace starling::actors::dht {

/// Limits of a record store.
struct store_limits {
  /// Largest key + sub-key + value, in bytes.
  size_t max_record_bytes = 64 * 1024;
  /// Most records held (a plain value or a sub-key counts one).
  size_t max_records = 100'000;
};

/// Why a record was or was not stored.
enum class store_status { accepted, too_large, full, older, expired, bad_signature, banned };

/// Counts of refused writes, by reason.
struct store_counters {
  uint64_t too_large = 0;
  uint64_t full = 0;
  uint64_t older = 0;
  uint64_t expired = 0;
  uint64_t bad_signature = 0;
  /// Records signed by a key this node banned (`ban_signer`).
  uint64_t banned = 0;
};

/// The records one node holds.
class record_store {
public:
  /// A store with the given limits.
  explicit record_store(store_limits limits = {});

  /// Stores `r` unless it is expired at `now_ns`, too large, wrongly signed, older than what
  /// is held (plain value against plain value or dictionary, sub-key against the same sub-key),
  /// or the store is full. Equal expirations replace. Refusals are counted.
  store_status put(const messages::dht_record& r, int64_t now_ns);

  /// The live records of `key` at `now_ns`: one plain record, or one per live sub-key.
  std::vector<messages::dht_record> get(const std::string& key, int64_t now_ns) const;

  /// Drops everything expired at `now_ns`.
  void purge(int64_t now_ns);

  /// Bans the signer `public_key` (a verdict this node verified, e.g. BTARD's): the records it
  /// signed are dropped now, its later writes are refused (`banned`, counted) and `get` never
  /// returns one. Returns the records dropped.
  size_t ban_signer(const std::string& public_key);
  /// True when `r` needs a signature from a signer banned here.
  bool signer_banned(const messages::dht_record& r) const;

  /// Records held (expired ones included until purged).
  size_t size() const { return count_; }
  /// Refusals so far.
  const store_counters& counters() const { return counters_; }
  /// The limits.
  const store_limits& limits() const { return limits_; }

private:
  struct entry {
    bool is_dict = false;
    messages::dht_record plain;
    std::map<std::string, messages::dht_record> subs;
    int64_t max_expiration() const;
  };

  /// Removes the expired parts of `e`; returns false when nothing is left.
  bool purge_entry(entry& e, int64_t now_ns);
  bool make_room(int64_t now_ns);

  store_limits limits_;
  std::map<std::string, entry> entries_;
  size_t count_ = 0;
  store_counters counters_;
  std::set<std::string> banned_;
};

} // namespace starling::actors::dht
