// BTARD's audit log (`btard-audit.jsonl`) and its checker (`starling audit FILE`).
//
// One JSON object per line. The first is the header (run id, seed, model size, the peers' public
// keys, the protocol's options, r_{-1}); then one line per step: r_prev, every member's batch
// seed, and per aggregation attempt the group, every signed statement published (part digests,
// result digests, MPRNG commits and reveals, projections, accusations; equivocation proofs),
// r_t, validators and targets, the aggregate checks,
// the verdicts with their re-check outcomes, bans and removals; then each peer's parameter
// digest after the step. Every line carries `prev`, the BLAKE2b-256 of the line before it, so a
// changed line breaks the chain at the next one.
//
// The checker verifies, from the log alone: the chain; every logged statement's signature, run
// id and step; each MPRNG draw (reveals match commitments; r_t is the hash of the reveals in
// key order); the seeds chain (step t's seeds from the r of step t−1's applied aggregation);
// validators drawn from r_t; each aggregate check recomputed from the signed projections; and each
// verdict's rule re-derived from its signed accusation and logged outcome (an equivocation from
// its logged proof). With `--recompute` it also recomputes each wrong-gradient re-check from the
// parameter checkpoint the run kept for that step. Wrong-aggregate and wrong-projection re-checks
// need the parts themselves, which the log does not keep: those verdicts are re-derived from the
// logged outcome only.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::btard {
struct step_record;
} // namespace starling::actors::btard

namespace starling::runtime::btard {

/// What the log's header says about the run.
struct audit_header {
  std::string run_id;
  uint64_t seed = 0;
  /// Parameters in the model (parts are equal splits of it).
  uint64_t dim = 0;
  /// Public keys in peer order.
  std::vector<std::string> peers;
  /// The protocol's options (protocol.hpp's group_options).
  std::string rule = "btard";
  double tau = 1.0;
  size_t iterations = 100;
  double tolerance = 1e-6;
  size_t validators = 1;
  double sigmas = 6.0;
  double validation_rel_tolerance = 0.0;
  double lr = 0.1;
  double momentum = 0.9;
  /// The task, for `--recompute` (an MLP on Fashion-MNIST or its synthetic stand-in): hidden
  /// width, batch, the model's seed, the data folder, synthetic fallback and training images.
  int64_t hidden = 64;
  uint64_t batch = 32;
  uint64_t model_seed = 0;
  std::string data_dir;
  bool synthetic_when_absent = false;
  uint64_t train_samples = 0;
  /// For a peer that came back into a running group: the step its log starts at and the
  /// shared randomness it took with the group's state (32 bytes). Empty: the log starts at
  /// step 0 from the run's initial randomness.
  uint64_t resumed_at = 0;
  std::string r_resumed;
};

/// The folder beside an audit log where a run keeps θ_t of each step that had a gradient
/// accusation (`step-<t>.params`: float32 values, little-endian).
std::string checkpoint_dir(const std::string& audit_path);

/// Writes the log line by line (flushed per step, so a stopped run keeps what it did).
class audit_writer {
public:
  /// Creates (truncates) `path` and writes the header.
  static result<audit_writer> open(const std::string& path, const audit_header& h);
  /// Appends a step.
  status write(const actors::btard::step_record& rec);
  /// Lines written.
  size_t lines() const { return lines_; }
  /// BLAKE2b-256 of the last line, hex: the digest of the whole log (each line chains the one
  /// before), the same for runs of the same seed.
  const std::string& head() const { return prev_; }

private:
  audit_writer() = default;
  status line(const std::string& text);
  std::string path_;
  std::ofstream out_;
  std::string prev_;
  size_t lines_ = 0;
};

/// What the checker verified.
struct audit_report {
  size_t steps = 0;
  size_t attempts = 0;
  size_t statements = 0;
  size_t draws = 0;
  size_t checks = 0;
  size_t verdicts = 0;
  size_t bans = 0;
  /// Wrong-gradient verdicts whose re-check was recomputed (with `recompute`).
  size_t recomputed = 0;
  /// Set for the log of a peer that came back into a running group: the step it starts at (its
  /// chain starts from the randomness of the state the group signed; the steps before are in
  /// the other peers' logs).
  std::optional<uint64_t> resumed_at;
  /// Each problem with the line it is on; empty: the log checks.
  std::vector<std::string> problems;
};

/// Checks the log at `path`; with `recompute`, also re-checks every wrong-gradient verdict by
/// recomputing the accused's gradient from its public seed at the kept parameters θ_t (whose
/// digest must be the one the log gives for the step before) and comparing it with the accused's
/// signed part digests. Fails only when the file cannot be read or has no header line (or, with
/// `recompute`, the task cannot be rebuilt); everything else found is a problem in the report.
result<audit_report> check_audit(const std::string& path, bool recompute = false);

} // namespace starling::runtime::btard
