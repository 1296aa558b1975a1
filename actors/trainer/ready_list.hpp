// The wiring's min-heap of one stage: the ready peers ordered by (load, name) in one sorted
// array. The wiring reads it whole for every hop (the candidates are drawn in this order from
// all ready peers, see `wiring_policy::sample`), which over a tree of 1250 peers was most of a
// 10,000-peer simulation's time; an array is walked in microseconds, and a peer whose load
// changes moves by one rotation of the entries between its old and new places.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace starling::actors::trainer {

/// Peers ordered by (load, name), as a `std::set<std::pair<double, std::string>>` would order
/// them, each with a number the caller keeps (the wiring: its measured forward throughput).
/// Names are borrowed: each must stay alive and unchanged while it is listed.
class ready_list {
public:
  /// One listed peer.
  struct entry {
    double load = 0.0;
    /// The peer's name (owned by the caller).
    const std::string* id = nullptr;
    /// Whether `value` holds the caller's number.
    bool has_value = false;
    double value = 0.0;
  };

  /// True when no peer is listed.
  bool empty() const noexcept { return xs_.empty(); }

  /// Number of listed peers.
  size_t size() const noexcept { return xs_.size(); }

  /// The peer with the least (load, name); the list must not be empty.
  const entry& front() const { return xs_.front(); }

  /// Every listed peer in (load, name) order.
  const std::vector<entry>& entries() const noexcept { return xs_; }

  /// Lists `id` at `load`; no effect when (load, id) is listed already.
  void insert(double load, const std::string& id, bool has_value, double value);

  /// Unlists (load, id); false when it was not listed.
  bool erase(double load, const std::string& id);

  /// Moves (load, id) to `new_load`; false (and nothing changes) when it was not listed.
  bool reload(double load, const std::string& id, double new_load);

  /// Sets the number of (load, id); false when it is not listed.
  bool set_value(double load, const std::string& id, bool has_value, double value);

  /// Whether (load, id) is listed.
  bool contains(double load, const std::string& id) const;

private:
  std::vector<entry>::const_iterator lower(double load, const std::string& id) const;
  /// The index of (load, id), or size() when it is not listed.
  size_t index_of(double load, const std::string& id) const;

  std::vector<entry> xs_;
};

} // namespace starling::actors::trainer
