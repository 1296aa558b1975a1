// The decentralized averager: one actor per participating peer. A request
//   (average_atom, std::string group_key, messages::tensor_list, double weight)
//     -> messages::average_result
// finds partners through the DHT, runs one load-balanced butterfly all-reduce with them and
// answers with the averaged tensors (same shapes and dtypes) and a report of which parts were
// averaged with whom. A single contiguous fp32 CPU tensor is averaged without a copy: the caller
// must not modify it in place until the reply (nor read it as its own values after cancelling:
// a part's result may still be written into it; actors/collab/settle.hpp hands over a copy).
// `(average_atom, group_key, tensor_list, weight, double topk_ratio, bool error_feedback)` asks for
// a Top-k round (sparse_parts.hpp: DiLoCo's pseudo-gradients): the input is sparse already, its
// chunks travel as their nonzeros, and each reducer re-sparsifies its part's mean keeping
// `topk_ratio` of it, with error feedback over its own whole-vector residual when asked. Every
// member of the group must ask for the same kind of round.
// `(average_atom, stop_atom, group_key)` cancels the request for `group_key`, running or queued
// (answered with an error; a running round's group treats this peer as gone), and nothing else;
// `(average_atom, stop_atom)` cancels whatever request runs now. Requests are served
// one at a time, in order. Input holding NaN or infinity is answered with an error outcome: it is
// checked while the request's join travels to its leader, and a group that formed meanwhile is
// told that this peer leaves.
//
// The actor is a thin shell around two pure cores: the matchmaker (matchmaker.hpp: DHT
// announcements, leader election, persistent groups) and the round engine (round_engine.hpp:
// the butterfly round, its chunks, credit windows, deadlines and report). The shell carries out
// their effects with CAF (DHT calls, peer messages, timers on CAF's clock), monitors the
// members, and moves chunks: over BASP (credit window `window`) or over the averagers' data
// plane.
//
// A member that never starts the round (crashed, joined another group in a race) is handled
// like any failure, so a wrong membership costs parts, never a hang. The round ends at the
// latest at `round_timeout` after the group message arrived.
//
// Direct links: chunks between two averagers that both have a direct transport
// (actors/transfer/transport.hpp: the node's, or one of the averager's own on `data_host`) travel
// over a pooled direct link instead of BASP: no credit window (TCP's flow control; a link reads
// no further while 2 of its chunks wait in the averager's mailbox), encoded on the link's thread,
// a result chunk encoded once for all its receivers. Before its first chunk to a member, an
// averager asks it over BASP for its transport and channel (and a link token); later rounds reuse
// the answer and the link. A member in client mode (no listener) is reached over the link it
// opened to send its own chunks; until that link exists its chunks take BASP.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/averager/butterfly.hpp"
#include "kernels/compress/format.hpp"

namespace starling::actors::transfer {
class transport;
struct link_security;
}

namespace starling::actors::averager {

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
  /// Codec of the chunks that leave the peer (its own part is never compressed), unless
  /// `adaptive_codec`.
  kernels::codec_id codec = kernels::codec_id::none;
  kernels::codec_params codec_params;
  /// `codec: auto`: per round, the candidate that should finish soonest on the links' measured
  /// throughput within `codec_error_budget` (codec_choice.hpp). Throughput is measured on direct
  /// links only; without one the smallest codec within the budget is used.
  bool adaptive_codec = false;
  /// Largest estimated relative L2 error of the result for `adaptive_codec`.
  double codec_error_budget = 1e-2;
  /// Codecs `adaptive_codec` chooses from (`none` is always among them).
  std::vector<kernels::codec_id> codec_candidates = {
      kernels::codec_id::none, kernels::codec_id::fp16, kernels::codec_id::blockwise8};
  /// Smallest part (elements) a reducer gets; smaller parts are merged away.
  int64_t min_part = 1;
  /// The reduction (weighted mean when empty).
  reduce_fn reducer;
  /// The direct transport to use (e.g. the node's, shared with its other users); null: one of
  /// the averager's own on `data_host`, if set.
  std::shared_ptr<transfer::transport> transport;
  /// Seals the links of the averager's own transport (a closed run: the node's
  /// `link_security()`); null: plaintext.
  std::shared_ptr<const transfer::link_security> data_security;
  /// IPv4 address the averager's own transport listens on (the node's address) when `transport`
  /// is null. Both empty: every chunk travels over BASP. Peers without a transport, or whose
  /// transport cannot be reached, are served over BASP either way.
  std::string data_host;
  /// Longest wait for progress inside a direct link's frame or connect (own transport).
  caf::timespan data_io_timeout = std::chrono::seconds(10);
  /// Remember a group that completed a round and re-form it at once while its members stay
  /// (matchmaker.hpp); the DHT is asked only when membership changes.
  bool persistent_groups = true;
  /// Remember them per key family, across numbered round keys ("p/grad/17", "p/grad/18"):
  /// `matchmaker_options::family_groups`.
  bool family_groups = false;
  /// BTARD hook: digest every part sent and received (round_engine.hpp). Off: no cost.
  bool hash_parts = false;
  /// Write the result into the request's vector instead of a second one (one contiguous fp32
  /// CPU tensor; several are concatenated into a private vector first, which then takes the
  /// result): one vector less resident per round, and no copy of the own values. The caller
  /// hands its tensor over until the reply, whose tensor is then a view of it. A part that ends
  /// unaveraged keeps the own values except where some of its result had already arrived
  /// (averaged values there; the part's report says how many). Off: the request's tensor is
  /// never written.
  bool in_place = false;
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
