// Kademlia routing table: k-buckets over id prefixes, split when the bucket holding our own id
// fills, a replacement cache per bucket, eviction of peers that stop answering (no CAF).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/dht/node_id.hpp"

namespace starling::actors::dht {

/// A known peer.
struct peer_entry {
  node_id id;
  std::string address;
  /// DHT time the peer was last heard from.
  int64_t last_seen_ns = 0;
  /// Failed requests since it last answered.
  int failures = 0;
};

/// What `routing_table::add_or_update` did.
enum class add_outcome {
  /// The peer is new and now in its bucket.
  added,
  /// The peer was known; its address and last-seen time were refreshed.
  updated,
  /// Its bucket is full and cannot split: the peer waits in the replacement cache and the
  /// caller should ping `oldest`, evicting it with `mark_failed` if it does not answer.
  full,
  /// The peer is ourselves: ignored.
  self,
};

/// Result of `routing_table::add_or_update`.
struct add_result {
  add_outcome outcome = add_outcome::added;
  /// For `full`: the least recently seen peer of the bucket.
  std::optional<peer_entry> oldest;
};

/// Settings of a routing table.
struct routing_options {
  /// Bucket size (k).
  size_t k = 20;
  /// Peers kept waiting per full bucket.
  size_t replacements = 20;
  /// Failed requests after which a peer is evicted.
  int max_failures = 1;
};

/// The k-buckets of one node.
class routing_table {
public:
  /// A table for the node `self`.
  routing_table(node_id self, routing_options opts);

  /// Records that `id` at `address` was heard from at `now_ns`.
  add_result add_or_update(const node_id& id, const std::string& address, int64_t now_ns);

  /// Counts a failed request to `id`; evicts it at `max_failures` and promotes the most recent
  /// replacement. Returns true when the peer was evicted.
  bool mark_failed(const node_id& id);

  /// Up to `count` known peers nearest to `target`, nearest first.
  std::vector<peer_entry> nearest(const node_id& target, size_t count) const;

  /// The entry of `id`, if known (not counting replacements).
  std::optional<peer_entry> find(const node_id& id) const;

  /// Number of peers in buckets.
  size_t size() const;
  /// Number of buckets.
  size_t num_buckets() const { return buckets_.size(); }
  /// Peers evicted so far.
  uint64_t evictions() const { return evictions_; }
  /// Our own id.
  const node_id& self() const { return self_; }
  /// The options.
  const routing_options& options() const { return opts_; }

private:
  struct bucket {
    node_id prefix;
    size_t depth = 0;
    /// Least recently seen first.
    std::vector<peer_entry> peers;
    /// Most recently seen last.
    std::vector<peer_entry> replacements;
    bool covers(const node_id& id) const { return common_prefix(prefix, id) >= depth; }
  };

  size_t bucket_of(const node_id& id) const;
  void split(size_t index);

  node_id self_;
  routing_options opts_;
  std::vector<bucket> buckets_;
  uint64_t evictions_ = 0;
};

} // namespace starling::actors::dht
