// The decentralized averager: one actor per participating peer. A request
//   (average_atom, std::string group_key, messages::tensor_list, double weight)
//     -> messages::average_result
// finds partners through the DHT, runs one load-balanced butterfly all-reduce with them and
// answers with the averaged tensors (same shapes and dtypes) and a report of which parts were
// averaged with whom. A single contiguous fp32 CPU tensor is averaged without a copy: the caller
// must not modify it in place until the reply. `(average_atom, stop_atom)` cancels the current request (it is answered
// with an error; the group treats this peer as gone). Requests are served one at a time, in order.
//
// Matchmaking protocol (why: peers see slightly different DHT views, so "everyone computes the
// same group from the DHT" does not converge; a leader that decides the membership and tells
// everyone does, and needs only that views eventually agree on who is smallest):
//   1. A peer announces itself under the DHT dictionary key `key_prefix + group_key`
//      (subkey = its address, value = bandwidth, auxiliary flag, vector size; expiration =
//      now + 2 windows) and then polls that key every `poll_interval` during the window.
//   2. Its leader is the smallest address it has seen with the same vector size, itself included,
//      that has not refused it. When it sees a smaller one than its current leader it sends
//      `avg_join` to it (and `avg_leave` to the old one; if it was leading, it sends `avg_leave`
//      with the new leader to its followers, who follow it there). A leader only ever switches
//      to smaller addresses, so the choices converge on the smallest live peer.
//   3. A leader accepts joins from larger addresses while it leads and is not full, redirects
//      joiners to its own leader when it follows someone, and refuses otherwise. It closes the
//      group when full (`target_group_size`) or at the end of the window, and sends `avg_group`
//      (the ordered members, sorted by address, and a group id) to every member.
//   4. A peer that leads nobody at the end of the window, or follows a leader that sends no group
//      within `join_grace` after it, answers `no_partner` with its values unchanged.
//   A member that never starts the round (crashed, joined another group in a race) is handled
//   like any failure below, so a wrong membership costs parts, never a hang.
//
// Butterfly round: the plan (`make_plan`) gives member i part i. Every non-auxiliary member
// sends part j of its flat fp32 vector to member j in chunks of at most `chunk_bytes`, at most
// `window` unacknowledged chunks per destination, compressed with `codec`; member j reduces
// (pluggable, weighted mean by default) once every sender completed or was excluded, or at
// `reduce_fraction` of the round deadline, and sends the result back the same way. Members
// monitor each other: a sender that goes down or is cut at the deadline stops counting there —
// the weighted mean streams chunk by chunk, so the chunks it delivered count and the rest of the
// part is averaged without it (the report's `segments` say who reached which elements; a kept-
// chunks reducer such as CenteredClip counts only complete contributions); a reducer that goes down, fails or misses the round deadline leaves its part with the peer's own
// values. The round ends at the latest at `round_timeout` after the group message arrived.
//
// Data plane: with `data_host` set, chunks between two averagers that both have a plane travel
// over a persistent direct TCP link (data_plane.hpp) instead of BASP: no credit window (TCP's
// flow control; a link reads no further while 2 of its chunks wait in the averager's mailbox),
// encoded on the link's thread, a result chunk encoded once for all its
// receivers. The first round between two peers asks the receiver for a link token over BASP;
// later rounds reuse the link. Test faults that delay chunks use BASP.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/averager/butterfly.hpp"
#include "kernels/compress/format.hpp"

namespace starling::actors::averager {

/// Faults a test can inject into one averager (hivemind's tests do the same with a subclass).
enum class injected_fault : uint8_t {
  none,
  /// Quits as soon as the group is formed, before sending anything.
  fail_before,
  /// Quits after sending half of its contribution chunks.
  fail_sending,
  /// Quits once it has everything to reduce, before sending any result.
  fail_reducing,
  /// Delays every contribution chunk by `fault_delay`.
  slow_sending,
  /// Delays every result chunk by `fault_delay`.
  slow_reducing,
  /// Cancels its request as soon as the group is formed (as `(average_atom, stop_atom)`).
  cancel,
};

/// Settings of one averager.
struct averager_options {
  /// This averager's address as peers resolve it (`host:port/name`).
  std::string address;
  /// Relative bandwidth for load balancing; 0 = client mode (reduces nothing).
  double bandwidth = 1.0;
  /// Auxiliary: reduces parts but contributes no data and keeps its own values.
  bool auxiliary = false;
  /// Largest group; a leader closes the group as soon as it is full.
  uint32_t target_group_size = 16;
  /// Prefix of the DHT key the group key is announced under.
  std::string key_prefix = "avg.";
  /// How long peers gather under a key before the leader closes the group.
  caf::timespan matchmaking_window = std::chrono::seconds(2);
  /// DHT polling period within the window.
  caf::timespan poll_interval = std::chrono::milliseconds(250);
  /// How long a follower waits for the group after the window before giving up.
  caf::timespan join_grace = std::chrono::seconds(2);
  /// Timeout of DHT calls, resolves and join requests.
  caf::timespan rpc_timeout = std::chrono::seconds(2);
  /// Deadline of the whole round from the group message.
  caf::timespan round_timeout = std::chrono::seconds(10);
  /// Reducers reduce with what arrived at this fraction of `round_timeout`.
  double reduce_fraction = 0.6;
  /// Largest chunk in raw fp32 bytes (0 = a whole part per message).
  uint64_t chunk_bytes = uint64_t{1} << 20;
  /// Unacknowledged chunks per destination.
  uint32_t window = 4;
  /// Codec of the chunks that leave the peer (its own part is never compressed).
  kernels::codec_id codec = kernels::codec_id::none;
  kernels::codec_params codec_params;
  /// Smallest part (elements) a reducer gets; smaller parts are merged away.
  int64_t min_part = 1;
  /// The reduction (weighted mean when empty).
  reduce_fn reducer;
  /// IPv4 address the averager's data plane listens on (data_plane.hpp; the node's own address).
  /// Empty: no data plane, every chunk travels over BASP. Peers without a plane, or whose plane
  /// cannot be reached, are served over BASP either way.
  std::string data_host;
  /// Longest wait for progress inside a data-plane frame or connect.
  caf::timespan data_io_timeout = std::chrono::seconds(10);
  /// Test hook.
  injected_fault fault = injected_fault::none;
  caf::timespan fault_delay = std::chrono::seconds(30);
};

/// Checks an options struct (address set, positive timeouts, window >= 1, ...).
status validate(const averager_options& opts);

/// Spawns an averager that uses the DHT actor `dht` and resolves peers through `resolver`
/// (`(resolve_atom, address) -> actor`). Register it under `opts.address` for peers.
caf::actor spawn_averager(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                          averager_options opts);

/// The averager's behaviour, for simulation nodes and custom spawners.
caf::behavior averager_actor(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                             averager_options opts);

} // namespace starling::actors::averager
