// The pure core of one butterfly all-reduce round (no CAF): who reduces which part of the flat
// vector, a per-part reducer that collects contributions and reduces them with a pluggable
// kernel, and the round report that says which parts were averaged with whom.
//
// A group has n ordered members. Member i reduces part i (its size comes from `balance_parts`
// over the members' bandwidths; client-mode members, bandwidth 0, get an empty part). Every
// non-auxiliary member sends part j of its flat vector to member j, which reduces the parts it
// received and sends the result back to every non-auxiliary member. Auxiliary members reduce but
// contribute nothing (weight 0) and keep their own values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/aggregate/aggregate.hpp"
#include "kernels/result.hpp"
#include "messages/averager.hpp"

namespace starling::actors::averager {

using messages::member_info;
using messages::part_report;
using messages::part_status;
using messages::round_outcome;
using messages::round_report;

/// Which member reduces which slice of the flat vector.
struct round_plan {
  std::vector<member_info> members;
  /// Elements of the flat vector.
  int64_t size = 0;
  /// Part i (reduced by member i): elements [offsets[i], offsets[i] + sizes[i]).
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  size_t num_members() const { return members.size(); }
  /// Members that send their data (non-auxiliary), in member order.
  std::vector<size_t> senders() const;
};

/// Cuts a vector of `size` elements among `members` with `balance_parts` (parts smaller than
/// `min_part` are merged away). Fails on an empty group, a negative or non-finite bandwidth, all
/// bandwidths zero, or a group made only of auxiliary members. A zero-size vector gives empty parts.
result<round_plan> make_plan(std::vector<member_info> members, int64_t size, int64_t min_part = 1);

/// A reduction of same-shape parts with weights: weighted mean by default, CenteredClip for BTARD.
using reduce_fn =
    std::function<result<at::Tensor>(const std::vector<at::Tensor>&, const std::vector<double>&)>;

/// Σ wᵢ xᵢ / Σ wᵢ (kernels::weighted_mean).
reduce_fn weighted_mean_reducer();
/// CenteredClip with `options` (kernels::centered_clip).
reduce_fn centered_clip_reducer(kernels::centered_clip_options options);

/// Collects the contributions to one part, in chunks, and reduces the complete ones.
/// A contribution counts only once all its elements arrived; `exclude` drops a sender (died,
/// missed the deadline) together with whatever it had delivered. Chunks are kept as they came
/// (no copy: a received chunk's buffer is reused by the network layer once the reducer drops it),
/// and the weighted mean (an empty `fn`) is accumulated chunk by chunk into one output buffer;
/// another `fn` gets each contribution as one contiguous tensor.
class part_reducer {
public:
  /// A part of `part_size` elements expecting contributions from `expected` (member indices),
  /// reduced with `fn` (empty: the weighted mean, streamed).
  part_reducer(int64_t part_size, std::vector<size_t> expected, reduce_fn fn);

  /// Adds `values` (1-D, any float dtype; kept, not copied, so it must not change afterwards) at
  /// element `offset` of sender `peer`'s contribution with `weight`. Fails (changing nothing) for
  /// an unexpected or excluded peer, a weight that is negative, not finite or differs from the one
  /// of its earlier chunks, a range outside the part, an overlap with what it already delivered,
  /// or non-finite values.
  status add(size_t peer, double weight, int64_t offset, const at::Tensor& values);
  /// Drops `peer`'s contribution if it is not complete yet; no-op otherwise.
  void exclude(size_t peer);
  /// True once every expected peer either completed or was excluded.
  bool complete() const;
  /// Complete contributors so far, ascending.
  std::vector<size_t> contributors() const;
  /// Reduces the complete contributions into a 1-D fp32 tensor of the part's size: into `out`
  /// when it is a contiguous fp32 tensor of that size (reused buffer), else a new one. Fails
  /// when there are none or the kernel fails (e.g. all weights zero for the weighted mean).
  result<at::Tensor> reduce(at::Tensor out = {}) const;
  int64_t size() const { return size_; }

private:
  struct slot {
    size_t peer = 0;
    double weight = -1;
    int64_t received = 0;
    bool excluded = false;
    /// (offset, values) as they arrived.
    std::vector<std::pair<int64_t, at::Tensor>> pieces;
  };
  slot* find(size_t peer);
  const slot* find(size_t peer) const;
  /// One contiguous fp32 tensor of a complete slot (its only piece when that covers the part).
  at::Tensor assemble(const slot& s) const;

  int64_t size_;
  reduce_fn fn_;
  std::vector<slot> slots_;
};

/// True when `t` (any float tensor) holds no NaN or infinity; reads it without temporaries of
/// its size (min and max propagate NaN).
bool all_finite(const at::Tensor& t);

/// Recounts `averaged/kept/failed` from `r.parts` and sets `outcome` to complete or partial.
void finish_report(round_report& r);

/// One line summarizing a report (outcome, members, counts) for logs.
std::string summary(const round_report& r);

} // namespace starling::actors::averager
