// Loss bursts: microbatches whose training loss jumps above the recent level, which a smoothed
// curve (EMA 0.95) hides. The swarm reporter feeds every completed microbatch here and names the
// bursts in its summary; `scripts/compare-runs` applies the same rule to a run's metrics.jsonl.
//
// The rule. A microbatch is flagged when its loss exceeds the median of the last `window`
// unflagged losses (completion order) by more than `margin`, once `min_history` losses are
// known. Unflagged only: a long burst does not raise its own reference. A burst is a run of
// consecutive flagged microbatches. The default margin, 0.5 nats, is over 3x the largest
// deviation from that median seen in runs of configs/swarm-tiny.yaml without bursts (p99 0.09,
// max 0.15; docs/results.md "Loss spikes").
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace starling::runtime {

/// A run of consecutive flagged microbatches.
struct loss_burst {
  /// Completion times (run seconds) of its first and last microbatch.
  double start_t = 0;
  double end_t = 0;
  int64_t batches = 0;
  /// The largest loss in it, and its excess over the reference at that point.
  double peak_loss = 0;
  double peak_excess = 0;
  /// The reference (median) when the burst began.
  double reference = 0;
};

/// Flags loss bursts in a stream of microbatch losses (see the file comment). Pure.
class burst_detector {
public:
  struct options {
    size_t window = 32;
    size_t min_history = 8;
    double margin = 0.5;
  };

  burst_detector() : burst_detector(options{}) {}
  explicit burst_detector(options o);

  /// One completed microbatch: its completion time and loss. Returns whether it is flagged.
  /// Non-finite losses are flagged (with an infinite excess).
  bool add(double t, double loss);

  /// Microbatches flagged so far.
  int64_t flagged() const noexcept { return flagged_; }
  /// The bursts so far (the last one may still grow).
  const std::vector<loss_burst>& bursts() const noexcept { return bursts_; }
  /// The largest excess over the reference seen (flagged or not; 0 before `min_history`).
  double largest_excess() const noexcept { return largest_; }
  const options& settings() const noexcept { return opts_; }

private:
  double reference() const;

  options opts_;
  std::deque<double> recent_;
  int64_t flagged_ = 0;
  bool in_burst_ = false;
  double largest_ = 0;
  std::vector<loss_burst> bursts_;
};

} // namespace starling::runtime
