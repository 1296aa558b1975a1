// Atoms shared by starling actors (at most 10 characters each, CAF 0.17).
#pragma once

#include <caf/atom.hpp>

namespace starling {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using put_atom = caf::atom_constant<caf::atom("put")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using resolve_atom = caf::atom_constant<caf::atom("resolve")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using metric_atom = caf::atom_constant<caf::atom("metric")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using state_atom = caf::atom_constant<caf::atom("state")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using report_atom = caf::atom_constant<caf::atom("report")>;

/// vi (MASHA): server → worker, "apply this downlink (if any) and send your next uplink".
using vi_step_atom = caf::atom_constant<caf::atom("vi_step")>;
/// vi (MASHA): server → worker, "apply the last downlink and report your state".
using vi_finish_atom = caf::atom_constant<caf::atom("vi_finish")>;
/// vi (MASHA): client → server, "run this many iterations".
using vi_run_atom = caf::atom_constant<caf::atom("vi_run")>;
/// Asks a DHT actor for its Ed25519 public key.
using dht_key_atom = caf::atom_constant<caf::atom("dhtkey")>;
/// averager: `(average_atom, group_key, tensor_list, weight) -> average_result`.
using average_atom = caf::atom_constant<caf::atom("average")>;
/// averager internal: a round or matchmaking deadline fired.
using avg_timer_atom = caf::atom_constant<caf::atom("avg_timer")>;
using transfer_atom = caf::atom_constant<caf::atom("transfer")>;
/// Supervisor: "preempt child i" (fault injection) and "child respawned" (to the observer).
using preempt_atom = caf::atom_constant<caf::atom("preempt")>;
using respawn_atom = caf::atom_constant<caf::atom("respawn")>;

} // namespace starling
