// The numbers of a volunteer's progress line (`your contribution: N samples, M accepted, uptime
// T`, runtime/experiment/cluster_runner.cpp), from two sources seen at different moments:
// - the run's ledger (runtime/observe/ledger.hpp): the slot's row, which partners credit by the
//   slot's name and which sums the name's incarnations, so it holds what earlier holders of the
//   slot computed and were credited with. The row as the first read after the volunteer took the
//   slot shows it (before its instance starts) is the baseline its own numbers count from;
// - its instance's own step and drop reports on this node, as they happen (its summary in the
//   DHT is up to one publication period older than its partners' credits).
// Samples are the larger of its own reports and its summary's word beyond the baseline (each a
// lower bound of what it computed). Accepted are its partners' credits beyond the baseline, at
// most its samples: a partner's credit for a round can be read before this node's report of the
// same step, and a credit a previous holder earned just before leaving can be published after
// the baseline; a partner never credits more samples than it received, so such an excess waits
// until the samples catch up instead of showing more accepted than computed.
#pragma once

#include <algorithm>
#include <cmath>

namespace starling::runtime {

/// A volunteer's counts (see the file comment). Not thread-safe.
class contribution_count {
public:
  /// One ledger read of the slot's row (0, 0 when it has none); the first is the baseline.
  void ledger_read(double computed, double accepted) {
    if (!std::isfinite(computed) || !std::isfinite(accepted))
      return;
    if (!baseline_) {
      baseline_ = true;
      computed_before_ = computed;
      accepted_before_ = accepted;
    }
    computed_ = computed;
    accepted_ = accepted;
  }

  /// Samples this node's instance reported in a step or a drop (finite and > 0, else ignored).
  void own_samples(double samples) {
    if (std::isfinite(samples) && samples > 0)
      own_ += samples;
  }

  /// True once the first ledger read came.
  bool has_baseline() const noexcept { return baseline_; }

  /// Samples this volunteer computed.
  double samples() const noexcept { return std::max(own_, computed_ - computed_before_); }

  /// Samples its partners credited it with, at most `samples()`.
  double accepted() const noexcept {
    return std::min(std::max(0.0, accepted_ - accepted_before_), samples());
  }

private:
  bool baseline_ = false;
  double computed_before_ = 0;
  double accepted_before_ = 0;
  double computed_ = 0;
  double accepted_ = 0;
  double own_ = 0;
};

} // namespace starling::runtime
