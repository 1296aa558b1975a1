// The CAF side shared by the actors that own a `coordinator` (actors/dp_peer, actors/stage): the
// conversion of CAF's clock into the core's seconds, the progress records' DHT puts (owned,
// signed sub-keys) and reads (with the wait for a bootstrapping DHT). The one file of
// actors/collab that knows CAF; the cores themselves stay free of it.
#pragma once

#include <functional>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>

#include "actors/collab/progress.hpp"
#include "actors/dht/client.hpp"
#include "messages/dht.hpp"

namespace starling::actors::collab {

/// `(collab_reread_atom)`: read the progress records again (the last read showed nobody else).
using collab_reread_atom = caf::atom_constant<caf::atom("c_reread")>;

/// Now on the DHT clock of `self` (CAF's clock: virtual in simulation) in seconds: the `now` of
/// every event an owner feeds its coordinator.
template <class Self>
seconds now_s(Self* self) {
  return static_cast<double>(dht::dht_now_ns(self)) / 1e9;
}

/// `s` seconds as a CAF timespan (0 for a time in the past).
inline caf::timespan span_of(seconds s) {
  return std::chrono::duration_cast<caf::timespan>(
    std::chrono::duration<double>(std::max(0.0, s)));
}

/// The delay of a timer for the core's `wake_at{at}` seen at `now`: rounded up by a microsecond,
/// so that the timer never arrives before `at` as the core reads the clock (seconds in a double
/// lose up to ~0.1 us at today's epoch). A timer that came early would find nothing due, and the
/// core, which asks for each wake-up once, would not ask for it again: a peer without other
/// events (a stage whose trainers stopped) would fall silent and its record expire.
inline caf::timespan wake_delay(seconds at, seconds now) {
  return span_of(at - now) + std::chrono::microseconds(1);
}

/// `s` seconds on the DHT clock as nanoseconds (an expiration).
inline int64_t ns_of(seconds s) {
  return static_cast<int64_t>(std::llround(s * 1e9));
}

/// The sub-key of a peer's progress records: `address`, and with `node_key` the owner marker of
/// that key (`address|[owner:...]`), so that the DHT takes only records signed by the node.
std::string record_id(const std::string& address, const std::string& node_key = {});

/// The address part of a record id.
std::string address_of_id(const std::string& id);

/// The records of a progress read as the coordinator takes them (sub-keyed ones only), and
/// whether any of them is another peer's than `own_id`.
std::pair<std::vector<progress_entry>, bool> progress_entries(const messages::dht_get_result& r,
                                                              const std::string& own_id);

/// Progress reads that show no other peer are asked again a few times before one counts: the
/// node's DHT may still bootstrap (it then answers with the peer's own record only), and taken
/// as a view such a read shows a collaboration of one, so a newcomer would step alone at its
/// step instead of downloading the state. The first peer of a collaboration pays this once.
class blind_reads {
public:
  /// Between two reads asked again.
  static constexpr auto interval = std::chrono::milliseconds(250);

  /// Whether a read that showed another peer's record (`others`) or not is to be asked again
  /// (after `interval`) rather than fed to the core.
  bool ask_again(bool others) {
    if (!others && !seen_others_ && count_ < max_reads) {
      ++count_;
      return true;
    }
    seen_others_ = seen_others_ || others;
    return false;
  }

private:
  static constexpr int max_reads = 8;
  bool seen_others_ = false;
  int count_ = 0;
};

/// Stores a progress record (or tombstone) `value` under `key`, sub-key `id`, expiring at
/// `expires_at`; signed by the node when `sign`. `stored` (when set) gets how many DHT nodes
/// acknowledged it (0 on a refusal or timeout); otherwise fire and forget.
template <class Self>
void put_progress_record(Self* self, const caf::actor& dht, std::string key, std::string id,
                         std::vector<char> value, seconds expires_at, bool sign,
                         caf::timespan timeout, std::function<void(uint32_t)> stored = {}) {
  auto put = dht::make_subkey_put(std::move(key), std::move(id), std::move(value),
                                  ns_of(expires_at), sign);
  dht::dht_store(
    self, dht, std::move(put), timeout,
    [stored](const messages::dht_put_result& r) {
      if (stored)
        stored(r.wire_error.empty() ? r.accepted : 0);
    },
    [stored](caf::error&) {
      if (stored)
        stored(0);
    });
}

/// Reads the progress records under `key`: `got(entries)` with them, or `failed()`. A read that
/// `blind` says to ask again sends `collab_reread_atom` to `self` after `blind_reads::interval`
/// instead (the owner's handler reads again). `blind` must outlive the read (actor state).
template <class Self, class Got, class Failed>
void read_progress_records(Self* self, const caf::actor& dht, std::string key,
                           std::string own_id, caf::timespan timeout, blind_reads* blind, Got got,
                           Failed failed) {
  dht::dht_get(
    self, dht, std::move(key), timeout,
    [self, own_id, blind, got](const messages::dht_get_result& r) {
      auto [entries, others] = progress_entries(r, own_id);
      if (blind->ask_again(others)) {
        self->delayed_send(self, blind_reads::interval, collab_reread_atom::value);
        return;
      }
      got(entries);
    },
    [failed](caf::error&) { failed(); });
}

} // namespace starling::actors::collab
