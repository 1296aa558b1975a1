// A BTARD peer across processes: peer_core.hpp's phases, with the node's DHT as the public
// board. The thin actor around the core: it announces its key, waits for the run's peers,
// publishes what the core says, reads what the core waits for, and tells the core when a
// phase's deadline passed.
//
// The board on the DHT (every key under the run's prefix P):
//   P/members              sub-key = hex of a peer's public key, value = the key: who takes part
//                          (the run starts once the expected count announced);
//   P/s<step>              sub-key = hex of the statement's digest, value = the signed statement
//                          (self-authenticating: any reader may re-store it; a conflicting pair
//                          of one signer lands under two sub-keys, and a reader holding both
//                          has the proof);
//   P/d<step>.<attempt>.<kind>.<part>
//                          sub-key = <hex of sender>.<hex of committed digest>.<chunk>.<chunks>,
//                          value = float32 values of one chunk (48 KiB at most, under the DHT's
//                          64 KiB record limit): addressed by the digest its sender committed
//                          to, so a reader takes only bytes that match the commitment and
//                          nobody can overwrite them with others.
//   P/at                   sub-key = hex of a peer's key, value = the next step it takes
//                          (decimal): a peer that starts after the group did sees it running;
//   P/rejoin               sub-key = hex of a peer's key, value = the first step it asks to
//                          come back at (decimal): a peer out of the running group (found
//                          silent, behind the others, or restarted) asks for the state;
//   P/statesig.<hex key>   sub-key = <step>.<hex of signer>, value = the signer's signed
//                          `state_digest` of its state at the start of <step>, offered to
//                          <key>: every member that expects that peer back at <step> signs
//                          (the membership rules say who: not banned, cooled down);
//   P/state<step>          sub-key = <hex of sender>.<hex of state digest>.<chunk>.<chunks>,
//                          value = the exported state's bytes (48 KiB chunks), stored by three
//                          of those members (the first three in an order drawn from the
//                          peer's key and the step, so the same members are not always asked).
// Coming back (issue 41, item 1: "download the state, then commit afresh"): the peer takes the
// state whose digest more members sign than any other, once signatures stopped arriving for a
// second, and only when its signers are more than half of the members that state says took the
// step before (members coming back after a cool-down cannot sign). Honest members export identical bytes (they hold the same
// parameters, randomness and membership), so a state signed by a Byzantine coalition wins only
// when the coalition outnumbers the live honest members: BTARD's own assumption. The peer then
// commits in that step like any member. A member the rules expect back but that does not come
// in time is silent again, and silences count towards a ban as always. The step's first wait
// (the commitments) runs one more phase deadline when only members coming back at that step
// have not committed (once per step): they download the state before they can commit.
// Records are plain (not owner-signed): what authenticates them is the statement's signature
// or the committed digest. A reader polls every `poll`; a phase whose wait is not over after
// `phase_deadline` ends on the deadline (its missing markers are silences).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/auth/identity.hpp"
#include "actors/btard/peer_core.hpp"

namespace starling::actors::btard {

/// What the peer actor needs.
struct board_peer_options {
  /// The protocol and this peer's attacks (group.run_id names the run in every statement).
  peer_core_options core;
  std::shared_ptr<const task> model;
  /// The peer's key (required).
  std::optional<auth::key_pair> key;
  /// The node's DHT actor (puts) and the reader gets go through (`spawn_board_reader`, shared
  /// by the node's peers; unset: the DHT actor itself), and the run's key prefix
  /// (`<experiment>/btard`).
  caf::actor dht;
  caf::actor reader;
  /// When the key is the node's own (one peer per node): every ban this peer's verdicts decide
  /// is handed to the node's gate (found as `gate` in `directory`) and DHT actor
  /// (actors/auth/ban_service.hpp), so the banned node's envelopes and records are refused.
  bool enforce_bans = false;
  caf::actor directory;
  std::string prefix;
  /// Peers of the run (the step 0 group), and steps to run.
  size_t peers = 2;
  /// For a peer whose gradients attack: how many attack (itself included). They find each
  /// other under `P/colluders` (honest peers never read it; a real coalition would use a
  /// private channel) for IPM's and ALIE's honest statistics. 0 for anyone else.
  size_t colluders = 0;
  uint64_t steps = 1;
  std::chrono::milliseconds poll{100};
  std::chrono::milliseconds phase_deadline{10000};
  /// How long to wait for every peer's announcement.
  std::chrono::milliseconds join_deadline{120000};
  /// Lifetime of the records it stores.
  std::chrono::milliseconds record_lifetime{600000};
  /// Called once the members are known (in key order), before step 0: returns τ (e.g. from the
  /// honest spread at the start, a pure function of public values), or nothing to keep
  /// core.group.tau. Fails the run on an error.
  std::function<result<std::optional<double>>(const std::vector<std::string>& members)> calibrate;
  /// Called after every step with its record and the core (progress, metrics, the audit log).
  std::function<void(const step_record&, const peer_core&)> on_step;
  /// Called once at the end: empty on success (every step ran, or this peer was banned, or it
  /// left the group: see `left`), else why the peer stopped.
  std::function<void(const std::string& error)> on_finish;
  /// Called (before `on_finish`) when the peer leaves the group for good while it is not
  /// banned: it could not come back (no state offered within `rejoin_deadline`, or more than
  /// `max_rejoins` times out). The argument says why.
  std::function<void(const std::string& why)> on_left;
  /// Called when the peer starts coming back into the running group (it found itself out of
  /// it, or it started after the group did: a restart), and when it took a state: the
  /// argument says which, and `step` is the step it will take next (0 while it waits).
  std::function<void(const std::string& what, uint64_t step)> on_rejoin;
  /// How long a peer coming back waits for a state the group offers.
  std::chrono::milliseconds rejoin_deadline{120000};
  /// How often a peer may come back in one life before it leaves.
  uint64_t max_rejoins = 5;
  /// How many times one wait's deadline is extended while most of the group marked a later
  /// phase of the aggregation (peer_core::majority_ahead: a marker this peer misses is late on
  /// its board, not silence).
  uint64_t max_extensions = 3;
  /// Called when a wait's deadline is extended (the step, and how many times in this wait).
  std::function<void(uint64_t step, uint64_t times)> on_extended;
  /// Called when a step's first wait runs one more deadline because only members coming back
  /// at this step (they download the state before they commit) have not committed
  /// (`peer_core::only_coming_back_missing`).
  std::function<void(uint64_t step)> on_returning_wait;
  /// Called when the node's gate took a ban (`enforce_bans`): the key, and how many admitted
  /// peers the gate removed.
  std::function<void(const std::string& key, uint64_t removed)> on_enforced;
};

/// The DHT key of a datum, and the sub-key of chunk `chunk` of `chunks` of it.
std::string data_key(const std::string& prefix, const data_ref& ref);
std::string data_subkey(const data_ref& ref, size_t chunk, size_t chunks);

/// Floats per chunk of a datum on the DHT.
inline constexpr size_t board_chunk_floats = 12288;

/// A node's shared board reader: `(get_atom, key) -> dht_get_result` like the DHT actor, but a
/// key read less than `fresh` ago is answered from that read, and concurrent gets of one key
/// share one DHT lookup. Every peer of a step polls the same keys; with several peers per node
/// their polls would otherwise multiply the node's DHT requests past the others' rate limits
/// (a refused put or get makes a peer silent).
caf::actor spawn_board_reader(caf::actor_system& sys, caf::actor dht,
                              std::chrono::milliseconds fresh);

/// Spawns the peer (detached: gradients and CenteredClip block its thread, not the node's).
caf::actor spawn_board_peer(caf::actor_system& sys, board_peer_options o);

} // namespace starling::actors::btard
