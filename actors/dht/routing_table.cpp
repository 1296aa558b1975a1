#include "actors/dht/routing_table.hpp"

#include <algorithm>

namespace starling::actors::dht {

routing_table::routing_table(node_id self, routing_options opts) : self_(self), opts_(opts) {
  buckets_.push_back(bucket{});
}

size_t routing_table::bucket_of(const node_id& id) const {
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].covers(id))
      return i;
  return 0; // unreachable: the buckets partition the id space
}

void routing_table::split(size_t index) {
  auto old = std::move(buckets_[index]);
  bucket lo;
  bucket hi;
  lo.prefix = old.prefix;
  hi.prefix = old.prefix;
  hi.prefix.bytes[old.depth / 8] |= static_cast<uint8_t>(0x80 >> (old.depth % 8));
  lo.depth = hi.depth = old.depth + 1;
  for (auto& p : old.peers)
    (p.id.bit(old.depth) ? hi : lo).peers.push_back(std::move(p));
  for (auto& p : old.replacements)
    (p.id.bit(old.depth) ? hi : lo).replacements.push_back(std::move(p));
  buckets_[index] = std::move(lo);
  buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(index) + 1, std::move(hi));
  // Refill from the replacement caches: a split frees room on both sides.
  for (auto i : {index, index + 1}) {
    auto& b = buckets_[i];
    while (b.peers.size() < opts_.k && !b.replacements.empty()) {
      b.peers.push_back(std::move(b.replacements.back()));
      b.replacements.pop_back();
    }
  }
}

add_result routing_table::add_or_update(const node_id& id, const std::string& address,
                                        int64_t now_ns) {
  if (id == self_)
    return {add_outcome::self, std::nullopt};
  for (;;) {
    auto& b = buckets_[bucket_of(id)];
    auto it = std::find_if(b.peers.begin(), b.peers.end(),
                           [&](const peer_entry& p) { return p.id == id; });
    if (it != b.peers.end()) {
      auto e = std::move(*it);
      b.peers.erase(it);
      e.address = address;
      e.last_seen_ns = now_ns;
      e.failures = 0;
      b.peers.push_back(std::move(e));
      return {add_outcome::updated, std::nullopt};
    }
    if (b.peers.size() < opts_.k) {
      b.peers.push_back(peer_entry{id, address, now_ns, 0});
      return {add_outcome::added, std::nullopt};
    }
    // Full: split only the bucket that holds our own id (Kademlia's rule), else wait as a
    // replacement while the caller checks the least recently seen peer.
    if (b.covers(self_) && b.depth < 8 * node_id::size) {
      split(bucket_of(id));
      continue;
    }
    auto rit = std::find_if(b.replacements.begin(), b.replacements.end(),
                            [&](const peer_entry& p) { return p.id == id; });
    if (rit != b.replacements.end())
      b.replacements.erase(rit);
    b.replacements.push_back(peer_entry{id, address, now_ns, 0});
    if (b.replacements.size() > opts_.replacements)
      b.replacements.erase(b.replacements.begin());
    return {add_outcome::full, b.peers.front()};
  }
}

bool routing_table::mark_failed(const node_id& id) {
  auto& b = buckets_[bucket_of(id)];
  auto it =
      std::find_if(b.peers.begin(), b.peers.end(), [&](const peer_entry& p) { return p.id == id; });
  if (it == b.peers.end()) {
    auto rit = std::find_if(b.replacements.begin(), b.replacements.end(),
                            [&](const peer_entry& p) { return p.id == id; });
    if (rit != b.replacements.end())
      b.replacements.erase(rit);
    return false;
  }
  if (++it->failures < opts_.max_failures)
    return false;
  b.peers.erase(it);
  ++evictions_;
  if (!b.replacements.empty()) {
    b.peers.push_back(std::move(b.replacements.back()));
    b.replacements.pop_back();
  }
  return true;
}

std::vector<peer_entry> routing_table::nearest(const node_id& target, size_t count) const {
  std::vector<peer_entry> all;
  for (auto& b : buckets_)
    all.insert(all.end(), b.peers.begin(), b.peers.end());
  auto n = std::min(count, all.size());
  std::partial_sort(
      all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(),
      [&](const peer_entry& a, const peer_entry& b) { return closer(target, a.id, b.id); });
  all.resize(n);
  return all;
}

std::optional<peer_entry> routing_table::find(const node_id& id) const {
  auto& b = buckets_[bucket_of(id)];
  for (auto& p : b.peers)
    if (p.id == id)
      return p;
  return std::nullopt;
}

size_t routing_table::size() const {
  size_t n = 0;
  for (auto& b : buckets_)
    n += b.peers.size();
  return n;
}

} // namespace starling::actors::dht
