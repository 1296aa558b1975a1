// What a board answers when a stage peer asks for the stages' loads (rebalancing), as pure
// functions shared by the in-process board's semantics and the DHT-backed board.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace starling::actors::stage {

/// What a board knows of one stage.
struct stage_load {
  /// Live peers announced in the stage.
  int64_t live = 0;
  /// Throughputs (samples/s, > 0) reported by live peers; at most `live` of them.
  std::vector<double> reported;
  /// Peers joining the stage (placed there or migrating), by expected throughput; a value <= 0
  /// stands for the stage's average.
  std::vector<double> joining;
};

/// A stage's summed throughput and peer count as rebalancing sees them.
struct stage_total {
  /// Summed throughput: live peers that have not reported count as the reported average, and
  /// joiners with their expected throughput. -1 when the stage has live peers but no report.
  double throughput = 0;
  /// Live peers plus the joiners that were counted.
  int64_t peers = 0;
};

/// The totals of one stage (see `stage_total`).
stage_total total_of(const stage_load& s);

/// The stage a new peer should join: the least total throughput, stages with unknown throughput
/// skipped (ties: the lowest index); none when no stage is known. With `all_known` (a
/// volunteer's first placement) none as well while some stage is unknown or no peer of any
/// stage has reported yet (a pipeline that has not run yet tells nothing).
std::optional<size_t> stage_for_newcomer(const std::vector<stage_load>& stages,
                                         bool all_known = false);

/// A stage peer's measured throughput for its reports: busy seconds and training samples since
/// the last report, smoothed across reports (exponentially, 0.3 on the newest window).
class throughput_meter {
public:
  /// Counts `busy_s` seconds of compute that served `samples` training samples (equivalents).
  void add(double busy_s, double samples) {
    busy_ += busy_s;
    samples_ += samples;
  }
  /// Closes the window: the smoothed throughput (samples per busy second), or none when the
  /// window measured nothing (the previous value stands).
  std::optional<double> close();

private:
  double busy_ = 0;
  double samples_ = 0;
  double smoothed_ = 0;
};

/// Text values of the DHT's load records, parsed strictly (nothing else in the value).
/// A throughput report: "<throughput> <queue>" with throughput > 0 and queue >= 0, both finite.
std::string encode_load_report(double throughput, double queue);
std::optional<double> decode_load_report(const std::string& value);

} // namespace starling::actors::stage
