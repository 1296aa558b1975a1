// A BTARD experiment: n peers, b of them Byzantine (drawn from the seed), training the MLP on
// Fashion-MNIST with one aggregation rule or several side by side (the plain mean, CenteredClip
// without the protocol, BTARD), the same optimizer and no step clipping for all. The `btard`
// kind (runtime/run/btard.cpp) reads it from YAML; examples/btard builds it in C++.
//
// It runs in one process (simulation and local mode): actors/btard/protocol.hpp's group, with
// real signatures, commitments, MPRNG, checks, validators and verdicts over a simulated network.
// Across processes (cluster mode) each `starling node` runs BTARD peers of its own
// (actors/btard/board_actor.hpp): the `btard` kind's `btard.peer` role, with the DHT as the
// board.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/btard/protocol.hpp"
#include "actors/btard/task.hpp"
#include "runtime/btard/audit.hpp"
#include "kernels/result.hpp"

namespace starling::runtime::btard {

/// Everything a BTARD experiment needs.
struct experiment_options {
  /// Name (the run id of every signed statement) and seed (keys, attackers, r_{-1}, the model).
  std::string name = "btard";
  uint64_t seed = 1;
  /// Peers, and how many of them attack.
  size_t peers = 16;
  size_t byzantine = 7;
  /// Steps each rule trains.
  uint64_t steps = 300;
  /// The rules compared, in order (each a full run from the same start).
  std::vector<actors::btard::aggregation_rule> rules{actors::btard::aggregation_rule::btard};
  /// The attackers' gradient attack (its kind none: honest gradients) ...
  actors::btard::attack_options attack;
  /// ... and protocol attack (at attack.start_step).
  actors::btard::protocol_attack protocol = actors::btard::protocol_attack::none;
  /// τ, iterations, tolerance, validators, optimizer, membership (rule and run id are set per run).
  actors::btard::group_options group;
  /// τ from the honest gradients' spread at the start: τ = tau_factor × the median distance of
  /// an honest gradient from the honest mean (0: use group.tau as given).
  double tau_factor = 0.0;
  /// The model and batch.
  actors::btard::mlp_task_options model;
  /// Fashion-MNIST folder; synthetic images when absent and allowed.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool synthetic_when_absent = false;
  /// Training images used (0: all) and test images evaluated (0: all).
  uint64_t train_samples = 0;
  uint64_t eval_samples = 0;
  /// Evaluate and print a progress line every this many steps.
  uint64_t eval_every = 50;
};

/// Checks the options (peers >= 2, byzantine < peers / 2, steps >= 1, the group's and model's own
/// checks).
status validate(const experiment_options& o);

/// One rule's outcome.
struct rule_outcome {
  actors::btard::aggregation_rule rule = actors::btard::aggregation_rule::btard;
  double accuracy = 0.0;
  double loss = 0.0;
  /// Attackers and honest peers banned, and the step each attacker was banned at.
  size_t attackers_banned = 0;
  size_t honest_banned = 0;
  std::vector<uint64_t> ban_steps;
  /// Steps that needed more than one aggregation.
  size_t redone_steps = 0;
  /// Aggregate checks that failed with nobody to blame and were verified by recomputing the
  /// part (CenteredClip stopped by the iteration cap).
  size_t recomputed_checks = 0;
  /// Fraction of CenteredClip inputs clipped (over all parts and steps).
  double clipped = 0.0;
  /// Wall time per step in milliseconds (the whole group in one thread), and its split: the
  /// members' gradients, the attacks, and each protocol phase (protocol.hpp's attempt_record).
  double ms_per_step = 0.0;
  std::map<std::string, double> ms_split;
  /// Bytes per step: parts and results between members, and signed statements.
  double bytes_data = 0.0;
  double bytes_statements = 0.0;
  /// The audit log (btard only).
  std::string audit_path;
};

/// The model and its data (Fashion-MNIST from `data_dir`, or synthetic images where allowed).
result<std::shared_ptr<const actors::btard::task>> make_task(const experiment_options& o);

/// Which peers attack: `byzantine` of `peers` drawn from the seed (by peer index).
std::vector<bool> attackers_of(const experiment_options& o);

/// τ = tau_factor × the median distance of an honest gradient's part from the honest mean's
/// part, at the starting parameters with the first step's seeds of the peers `keys` (public
/// values only: every peer computes the same τ).
result<double> calibrate_tau(const experiment_options& o, const actors::btard::task& t,
                             const std::vector<std::string>& keys);

/// The audit log's header of a BTARD run of `o` with group options `g` (τ as used) among
/// `peers` (public keys).
audit_header audit_header_of(const experiment_options& o, const actors::btard::group_options& g,
                             uint64_t dim, std::vector<std::string> peers);

/// Runs every rule of `o`, printing progress and a table, writing `btard-audit.jsonl` (BTARD
/// runs) into `out_dir` and checking it. Fails on bad options or missing data.
result<std::vector<rule_outcome>> run_experiment(const experiment_options& o,
                                                 const std::string& out_dir);

} // namespace starling::runtime::btard
