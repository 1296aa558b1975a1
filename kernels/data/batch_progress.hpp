// Which batches of a shard's stream are done: the resumable half of exactly-once training. A
// trainer's shard is a stream of batches 0, 1, 2, ... (`sample_loader::batch_at_step`), and
// batches complete out of order (several are in flight at once), so a loader position alone
// cannot say what was trained. This keeps a watermark (every batch below it is done) and the
// done batches above it; a restarted or resumed trainer redoes exactly the batches not done.
// No LibTorch.
#pragma once

#include "kernels/result.hpp"

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

namespace starling::kernels {

/// The done batches among batches [0, total) of one shard.
class batch_progress {
public:
  /// No batch of `total` done.
  explicit batch_progress(uint64_t total = 0);

  /// Batches to do in all.
  uint64_t total() const noexcept { return total_; }

  /// Batches done.
  uint64_t done_count() const noexcept { return watermark_ + above_.size(); }

  /// Whether every batch is done.
  bool complete() const noexcept { return done_count() == total_; }

  /// Every batch below this one is done.
  uint64_t watermark() const noexcept { return watermark_; }

  /// Whether `batch` is done.
  bool done(uint64_t batch) const;

  /// Marks `batch` done: true when it was not done yet, false when it was (a repeat, which
  /// changes nothing); fails when `batch` is not below `total()`.
  result<bool> mark_done(uint64_t batch);

  /// The first batch at or after `from` that is not done, or `total()` when there is none.
  uint64_t next_undone(uint64_t from) const;

  /// A version byte, total, watermark and the done batches above it as varint gaps: a few bytes
  /// while batches complete roughly in order.
  std::string serialize() const;

  /// Progress from `serialize`'s bytes; fails on malformed input (unknown version, truncated
  /// varints, a watermark past the total, batches out of order or out of range, trailing bytes).
  static result<batch_progress> parse(std::string_view bytes);

  friend bool operator==(const batch_progress& a, const batch_progress& b) {
    return a.total_ == b.total_ && a.watermark_ == b.watermark_ && a.above_ == b.above_;
  }
  friend bool operator!=(const batch_progress& a, const batch_progress& b) { return !(a == b); }

private:
  uint64_t total_;
  uint64_t watermark_ = 0;
  /// Done batches at or above the watermark + 1 (the watermark itself is never done).
  std::set<uint64_t> above_;
};

} // namespace starling::kernels
