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
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/aggregate/aggregate.hpp"
#include "kernels/result.hpp"
#include "messages/averager.hpp"

namespace starling::actors::averager {

using messages::member_info;
using messages::part_report;
using messages::part_segment;
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

/// Disjoint element ranges [lo, hi), adjacent ones merged: what a sender delivered of a part, or
/// which results of a part arrived.
class range_set {
public:
  /// Fails when [lo, hi) overlaps what is there.
  status check(int64_t lo, int64_t hi) const;
  /// Adds [lo, hi) (empty: no-op). Fails, changing nothing, when it overlaps what is there.
  status insert(int64_t lo, int64_t hi);
  /// True when [lo, hi) lies entirely inside the set (an empty range: always).
  bool covers(int64_t lo, int64_t hi) const;
  /// Elements in the set.
  int64_t size() const { return size_; }
  /// start -> end, in order.
  const std::map<int64_t, int64_t>& ranges() const { return ranges_; }
  void clear() {
    ranges_.clear();
    size_ = 0;
  }

private:
  std::map<int64_t, int64_t> ranges_;
  int64_t size_ = 0;
};

/// A reduced part: its values and which members reached which of its elements.
struct reduction {
  /// 1-D fp32, the part's size.
  at::Tensor values;
  /// The part cut where its contributors change (one segment when all reached every element),
  /// in order, covering it exactly.
  std::vector<part_segment> segments;
};

/// Appends `seg` to `segments`, or extends the last one when it ends where `seg` starts and has
/// the same contributors. True when a segment was added.
bool append_segment(std::vector<part_segment>& segments, part_segment seg);

/// Members in every segment (those that reached the whole part), ascending.
std::vector<uint32_t> common_contributors(const std::vector<part_segment>& segments);

/// Collects the contributions to one part, in chunks, and reduces them.
///
/// The weighted mean (an empty `fn`) streams: each chunk is added, weighted, into one
/// accumulator as it arrives and not kept (the network layer reuses its buffer at once), so a
/// reducer holds one part's worth of memory whatever the group size. A sender that fails or is
/// cut while sending counts on the elements it delivered and misses the rest; `reduce` divides
/// every segment by the weights that reached it and says who reached which segment.
///
/// Another `fn` (CenteredClip for BTARD) needs whole contributions: chunks are kept until the
/// reduction, a contribution counts only once all its elements arrived, and `exclude` drops an
/// incomplete sender together with what it had delivered.
class part_reducer {
public:
  /// A part of `part_size` elements expecting contributions from `expected` (member indices),
  /// reduced with `fn` (empty: the weighted mean, streamed). `buffer` (a contiguous fp32 tensor
  /// of the part's size, e.g. one reused from an earlier round) receives the result; another
  /// one is allocated when it does not fit.
  part_reducer(int64_t part_size, std::vector<size_t> expected, reduce_fn fn,
               at::Tensor buffer = {});

  /// Adds `values` (1-D, any float dtype) at element `offset` of sender `peer`'s contribution
  /// with `weight`. The weighted mean reads `values` here and drops them; another `fn` keeps
  /// them (not copied, so they must not change afterwards). Fails (changing nothing) for an
  /// unexpected or excluded peer, a weight that is negative, not finite or differs from the one
  /// of its earlier chunks, a range outside the part, an overlap with what it already delivered,
  /// non-finite values, or after `reduce`. `finite` says the caller checked already that
  /// `values` are finite (e.g. its own input): they are not read once more for that.
  status add(size_t peer, double weight, int64_t offset, const at::Tensor& values,
             bool finite = false);
  /// True when `peer` already delivered every element of [offset, offset + n): a chunk sent
  /// again (e.g. over BASP after its data-plane link broke) is then a duplicate to ignore.
  bool has(size_t peer, int64_t offset, int64_t n) const;
  /// Accepts nothing more from `peer` (died, missed the deadline, sent a bad chunk); no-op once
  /// it is complete. A kept-chunks `fn` also drops what it had delivered.
  void exclude(size_t peer);
  /// True once every expected peer either completed or was excluded.
  bool complete() const;
  /// Complete contributors so far, ascending.
  std::vector<size_t> contributors() const;
  /// The weight `peer` sent with a contribution that is complete and not excluded; -1 otherwise.
  double weight_of(size_t peer) const;
  /// Reduces into the buffer (once). Fails when nothing usable arrived: no contribution, elements
  /// no contribution reached, a total weight of 0 somewhere (the weighted mean), or the kernel
  /// failing. Ranges `finish_early` finished keep their values.
  result<reduction> reduce();
  /// The streamed weighted mean only: finishes elements [lo, hi) before the reduction when
  /// nothing more can change them, so that their result can go out while other senders are
  /// still sending (a butterfly round then overlaps its two phases, as a ring does). That is
  /// when every expected sender either delivered all of [lo, hi) or none of it and was excluded,
  /// at least one did, and their weights sum to more than 0: the range is divided by that sum
  /// at once, and `reduce` later leaves it alone (its segments say the same contributors).
  /// Returns the range as a segment with its contributors, or nothing (changing nothing) when a
  /// sender is still owed there, an excluded one delivered part of it, the weights sum to 0,
  /// the range is empty, outside the part or overlaps one finished before, or with another
  /// reduction.
  std::optional<part_segment> finish_early(int64_t lo, int64_t hi);
  /// A range `finish_early` finished: a view of its values in the result buffer (the buffer
  /// `reduce` returns).
  at::Tensor early_values(int64_t lo, int64_t hi) const { return acc_.narrow(0, lo, hi - lo); }
  int64_t size() const { return size_; }

private:
  struct slot {
    size_t peer = 0;
    double weight = -1;
    bool excluded = false;
    /// Delivered elements.
    range_set ranges;
    /// Kept-chunks `fn` only: (offset, values) as they arrived.
    std::vector<std::pair<int64_t, at::Tensor>> pieces;
  };
  slot* find(size_t peer);
  const slot* find(size_t peer) const;
  bool streaming() const { return !fn_; }
  /// One contiguous fp32 tensor of a complete slot (its only piece when that covers the part).
  at::Tensor assemble(const slot& s) const;
  result<reduction> reduce_streamed();
  result<reduction> reduce_kept();

  int64_t size_;
  reduce_fn fn_;
  std::vector<slot> slots_;
  /// The result; the weighted sum while streaming.
  at::Tensor acc_;
  /// Streaming: `acc_` holds the sum (it is zeroed on first use, or written by a first chunk
  /// that covers the whole part, which saves a pass over it).
  bool acc_ready_ = false;
  bool reduced_ = false;
  /// Streaming: ranges `finish_early` divided already.
  range_set early_;
};

/// True when `t` (any float tensor) holds no NaN or infinity; reads it without temporaries of
/// its size (min and max propagate NaN).
bool all_finite(const at::Tensor& t);

/// Recounts `averaged/kept/failed` from `r.parts` and sets `outcome` to complete or partial.
void finish_report(round_report& r);

/// One line summarizing a report (outcome, members, counts) for logs.
std::string summary(const round_report& r);

} // namespace starling::actors::averager
