// The iterative Kademlia lookup as a state machine (no CAF): up to alpha requests in flight, each
// to the closest not yet queried candidate among the k closest live ones; it converges when those
// k have all answered.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "actors/dht/node_id.hpp"

namespace starling::actors::dht {

/// Settings of a lookup.
struct lookup_options {
  /// How many closest peers the lookup converges on.
  size_t k = 20;
  /// Requests in flight at once.
  size_t alpha = 3;
};

/// A peer the lookup knows about.
struct candidate {
  /// Where a candidate is in the lookup.
  enum class state { fresh, in_flight, responded, failed };
  node_id id;
  std::string address;
  state st = state::fresh;
  /// 1 for the starting peers, parent's depth + 1 for peers learned from a response.
  uint32_t depth = 1;
};

/// One iterative lookup of `target`.
class lookup {
public:
  /// A lookup of `target` run by `self` (never queried).
  lookup(node_id target, node_id self, lookup_options opts);

  /// Adds peers learned at `depth` (duplicates and `self` are ignored).
  void add(const node_id& id, const std::string& address, uint32_t depth);

  /// The peers to query now (marked in flight).
  std::vector<candidate> next();

  /// `from` answered, naming `closer` peers (id, address).
  void on_response(const node_id& from, const std::vector<std::pair<node_id, std::string>>& closer);

  /// A request to `from` failed or timed out.
  void on_failure(const node_id& from);

  /// Stops the lookup early (e.g. a value was found): no more requests are proposed.
  void stop() { stopped_ = true; }

  /// True when nothing is in flight and nothing more is worth asking.
  bool done() const;

  /// Requests still in flight.
  size_t in_flight() const { return in_flight_; }

  /// Up to `n` peers that answered, nearest first.
  std::vector<candidate> closest_responded(size_t n) const;

  /// The candidate `id`, or nullptr.
  const candidate* find(const node_id& id) const;

  /// The deepest depth among peers that answered (0 if none).
  uint32_t hops() const;

  /// The target.
  const node_id& target() const { return target_; }

private:
  candidate* get(const node_id& id);
  bool has_work() const;

  node_id target_;
  node_id self_;
  lookup_options opts_;
  /// Nearest first.
  std::vector<candidate> cands_;
  std::set<node_id> seen_;
  size_t in_flight_ = 0;
  bool stopped_ = false;
};

} // namespace starling::actors::dht
