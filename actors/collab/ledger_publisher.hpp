// A peer's contribution summary in the DHT, for peers that are not data-parallel peers (SWARM
// trainers and stage peers): a small actor beside the peer that it feeds with what it did, and
// that stores the peer's signed `contribution_summary` (ledger_record.hpp) under
// `<experiment>/ledger/<shard>` every `every`, expiring after four periods, and once more with
// `left` when the peer leaves on purpose. Data-parallel peers publish their own (dp_peer.hpp).
//
// Protocol (all one-way; the peer's numbers are cumulative here, the messages carry increments):
//   (ledger_add_atom, double computed, double dropped, double rounds, double rounds_averaged)
//   (ledger_credit_atom, std::string partner, double samples)   a credit this peer gives
//   (ledger_gauge_atom, double loss, double step)               latest values (NaN: unchanged)
//   (ledger_left_atom)                                          publishes with `left`, then quits
// Increments that are negative or not finite are ignored.
#pragma once

#include <chrono>
#include <string>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::collab {

/// `(ledger_add_atom, computed, dropped, rounds, rounds_averaged)`.
using ledger_add_atom = caf::atom_constant<caf::atom("ledgeradd")>;
/// `(ledger_credit_atom, partner, samples)`.
using ledger_credit_atom = caf::atom_constant<caf::atom("ledgercrd")>;
/// `(ledger_gauge_atom, loss, step)`.
using ledger_gauge_atom = caf::atom_constant<caf::atom("ledgergau")>;
/// `(ledger_left_atom)`.
using ledger_left_atom = caf::atom_constant<caf::atom("ledgerleft")>;

/// Settings of one publisher.
struct ledger_publisher_options {
  /// The node's DHT actor (puts, and the node key that signs them).
  caf::actor dht;
  /// The run's key prefix: `<experiment>/ledger/<shard>`.
  std::string experiment;
  /// The peer's address: its record id (with the node key's owner marker when signing).
  std::string address;
  /// The ledger's row: the peer's instance name.
  std::string name;
  /// The SWARM stage the peer serves (negative: none).
  int stage = -1;
  /// In a closed run, its node's token id (hex); empty otherwise.
  std::string token_id;
  /// Between two publications (0: the publisher stores nothing).
  std::chrono::nanoseconds every{std::chrono::seconds(5)};
  /// Sign the records with the node's key.
  bool sign = true;
  /// Timeout of DHT calls.
  std::chrono::nanoseconds rpc_timeout{std::chrono::seconds(5)};
};

/// Spawns a publisher (see the file comment). It starts counting the peer's time at its spawn.
caf::actor spawn_ledger_publisher(caf::actor_system& sys, ledger_publisher_options opts);

} // namespace starling::actors::collab
