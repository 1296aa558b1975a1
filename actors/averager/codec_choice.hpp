// Adaptive compression (`codec: auto`): per round, the codec that should finish the round
// soonest among those whose estimated error of the result stays within a budget. Pure (no CAF):
// the averager feeds it measurements; tests feed it numbers.
//
// Model. In a butterfly round of n members over N elements each member sends and receives about
// m = 2 (n - 1) / n · N elements (contributions, then results). With codec c (b_c bytes and k_c
// CPU seconds per element for encoding plus decoding, measured on this member's data) over links
// of throughput B (bytes per second: the bytes a member wrote over its last rounds' durations, a
// lower bound that errs toward compressing; see `observe`), the round takes
// about T(c) = max(m · b_c / B, m · k_c): the links' threads encode and decode while others
// write, so whichever is slower bounds the round.
//
// Error. A codec's relative L2 error e_c is measured on a sample of this member's vector. A
// result element carries the error of n averaged contributions (e_c / sqrt(n) relative, when the
// members' errors are independent) and that of the compressed result chunk (e_c): the estimate
// is e_c · sqrt(1 + 1/n), relative to the scale of the members' vectors. (It assumes that the mean
// is about as large as the inputs, as for gradients of one model; for unrelated inputs whose mean
// is much smaller, the error relative to the mean grows accordingly.) Codecs whose estimate
// exceeds the budget are never chosen; `none` always fits.
//
// Before any throughput was measured, B counts as unknown and the smallest codec within budget is
// chosen (a slow network then pays no uncompressed first round).
//
// Observed rounds. The model misjudges where a round is bound by neither: B is a lower bound, so
// after a compressed round on one host (shared-memory links, memory-bound) fp32 looked 4x slower
// than it was and was never tried again (`auto` stayed 13-46% behind fp32 there). So each round's
// time is kept per codec (seconds per moved element, smoothed), a codec that was observed is
// judged by its observations, one that was not by the model, and the uncompressed codec is tried
// once whatever the model says (its round, free of CPU work, also measures the links best).
//
// Trying again. One noisy round must not decide for good, and links change: an observed codec
// that lost is tried once more when its last observation is `retry_after` rounds old and it came
// within `retry_ratio` of the best (a codec several times slower, as fp32 on slow links, is not
// retried); the fresh observation replaces the stale one.
//
// Same-host links. When every link of a round is a same-host link through shared-memory rings
// (transfer::transport::local_link), fp32 chunks are reduced in place from the ring while a
// compressed chunk is copied out and decoded: compression only adds CPU work, so the choice is
// the uncompressed codec, without exploring (on one host `auto` was 8-30% behind fp32 over ten
// rounds, from its exploring rounds and noisy observations).

#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"

namespace starling::actors::averager {

/// What one codec costs and loses on this member's data.
struct codec_profile {
  kernels::codec_id codec = kernels::codec_id::none;
  /// Encoded bytes per element.
  double bytes_per_element = 4;
  /// CPU seconds per element to encode and decode.
  double seconds_per_element = 0;
  /// ||decode(encode(x)) - x|| / ||x|| on a sample.
  double relative_error = 0;
};

/// Settings of the choice.
struct codec_choice_options {
  /// Codecs to choose from (`none` is always among them).
  std::vector<kernels::codec_id> candidates = {kernels::codec_id::none, kernels::codec_id::fp16,
                                               kernels::codec_id::blockwise8};
  /// Largest estimated relative L2 error of the result.
  double error_budget = 1e-2;
  /// Weight of the newest throughput measurement in the running estimate (0, 1].
  double smoothing = 0.5;
  /// Rounds after which an observed codec that lost is tried again (0: never).
  uint32_t retry_after = 16;
  /// ... when its observed time was at most this many times the best codec's.
  double retry_ratio = 1.5;
};

/// Measures `codec` on `sample` (1-D fp32): size, error and the time to encode and decode it,
/// read from `now_seconds` (a steady clock in the actor).
result<codec_profile> measure_codec(const at::Tensor& sample, kernels::codec_id codec,
                                    const kernels::codec_params& params,
                                    const std::function<double()>& now_seconds);

/// Picks the codec of each round from profiles and link throughput measurements.
class codec_chooser {
public:
  explicit codec_chooser(codec_choice_options opts = {});

  /// Sets (or replaces) a candidate's profile.
  void set_profile(const codec_profile& p);
  /// True once every candidate has a profile.
  bool profiled() const;
  /// A throughput measurement: `bytes` written to peers in a round of `seconds` (ignored when
  /// either is not positive).
  void observe(double bytes, double seconds);
  /// The current throughput estimate in bytes per second, if any was measured.
  std::optional<double> throughput() const { return throughput_; }
  /// Estimated relative error of the result with `codec` in a group of `members`.
  double estimated_error(kernels::codec_id codec, size_t members) const;
  /// Estimated seconds of a round over `elements` with `members`; unknown throughput counts as
  /// zero-cost network only when `throughput` is set.
  double estimated_seconds(kernels::codec_id codec, int64_t elements, size_t members) const;
  /// A round with `codec` over `elements` with `members` took `seconds` (ignored when not
  /// positive); also a throughput measurement of the bytes the round moved in that time.
  void observe_round(kernels::codec_id codec, int64_t elements, size_t members, double seconds);
  /// Whether the next round's links are all same-host shared-memory links (then `choose` takes
  /// the uncompressed codec). False until said.
  void set_links_local(bool local) { local_ = local; }
  bool links_local() const noexcept { return local_; }
  /// The codec for a round over `elements` with `members` (none before profiling).
  kernels::codec_id choose(int64_t elements, size_t members) const;
  /// Rounds observed so far.
  uint64_t rounds() const noexcept { return rounds_; }
  /// What the choice saw, for reports: each candidate's estimated seconds (CPU, network) and
  /// error, and the links' throughput.
  std::string describe(int64_t elements, size_t members) const;

private:
  codec_choice_options opts_;
  std::map<kernels::codec_id, codec_profile> profiles_;
  std::optional<double> throughput_;
  /// Observed seconds per moved element, by codec, and the round (1-based) of its last
  /// observation.
  struct observation {
    double seconds_per_element = 0;
    uint64_t round = 0;
  };
  std::map<kernels::codec_id, observation> observed_;
  uint64_t rounds_ = 0;
  bool local_ = false;
  /// True when `s` is stale: `retry_after` rounds or more old.
  bool stale(const observation& s) const;
};

} // namespace starling::actors::averager
