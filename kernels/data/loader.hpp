// A seeded, shardable, resumable loader of sample ids: each shard goes through its samples in
// epochs without replacement, in an order that is a pure function of (seed, shard, epoch), so a
// position of two numbers restores it exactly and anyone can recompute any peer's batch.
// No LibTorch: ids and positions only; a data source turns ids into tensors.
#pragma once

#include "kernels/result.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace starling::kernels {

/// Which samples a shard owns.
enum class shard_layout : uint8_t {
  /// Shard k of S owns ids [N·k/S, N·(k+1)/S): neighbouring windows stay on one shard, so shards
  /// of a text never read the same byte (except the one a window shares with the next).
  contiguous = 0,
  /// Shard k of S owns the ids at positions [N·k/S, N·(k+1)/S) of one seeded permutation of all
  /// ids: every shard is a uniform sample of the data set (a shard of a book is not one chapter),
  /// which keeps the peers' gradients alike. Membership depends on the seed, not on the epoch.
  scattered = 1,
};

/// The name of a layout ("contiguous", "scattered").
const char* to_string(shard_layout layout) noexcept;

/// Who reads what, in which order.
struct loader_options {
  /// Seed of every permutation (the shard layout's and each epoch's order).
  uint64_t seed = 0;
  /// Number of disjoint shards covering the data set (one per trainer or peer).
  uint64_t shards = 1;
  /// This loader's shard, in [0, shards).
  uint64_t shard = 0;
  /// How samples are dealt to shards; scattered by default so shards are alike.
  shard_layout layout = shard_layout::scattered;
};

/// Where a shard's loader stands: the next sample is the `offset`-th of epoch `epoch`.
struct loader_position {
  /// Epochs completed.
  uint64_t epoch = 0;
  /// Samples of the current epoch already handed out, in [0, shard size).
  uint64_t offset = 0;

  friend bool operator==(const loader_position& a, const loader_position& b) {
    return a.epoch == b.epoch && a.offset == b.offset;
  }
  friend bool operator!=(const loader_position& a, const loader_position& b) { return !(a == b); }
};

/// The ids of one shard of a data set of `samples` ids, epoch after epoch.
///
/// Epoch e of shard k is the shard's samples in the order of a Feistel permutation keyed by
/// (seed, k, e), so within an epoch every sample of the shard comes exactly once, and the
/// sample at any position is computed in O(1) without a shuffled vector. A batch that crosses
/// the end of an epoch continues with the next epoch's order (batches keep their size).
class sample_loader {
public:
  /// A loader over ids [0, samples) for `opts`; fails on no samples, more than 2^62 samples, no
  /// shards, a shard out of range, or more shards than samples (a shard would be empty).
  static result<sample_loader> make(uint64_t samples, const loader_options& opts);

  /// The data set's size N.
  uint64_t samples() const noexcept { return samples_; }

  /// Number of samples this shard owns (the length of its epoch).
  uint64_t shard_size() const noexcept { return end_ - begin_; }

  /// The options it was made with.
  const loader_options& options() const noexcept { return opts_; }

  /// The id at `p`; `p.offset` must be below `shard_size()`.
  uint64_t id_at(loader_position p) const noexcept;

  /// Whether this shard owns `id`.
  bool owns(uint64_t id) const noexcept;

  /// The next `count` ids; advances the position by `count`.
  std::vector<uint64_t> next(uint64_t count);

  /// Appends the next `count` ids to `out` (no allocation when `out` has room); advances.
  void next_into(uint64_t count, std::vector<uint64_t>& out);

  /// Where the loader stands.
  loader_position position() const noexcept { return pos_; }

  /// Moves to `p`; fails when `p.offset` is not below the shard size.
  status seek(loader_position p);

  /// The position `count` samples after `p`.
  loader_position advanced(loader_position p, uint64_t count) const noexcept;

  /// The batch that step `step` reads with batches of `batch` ids: the ids at positions
  /// [step·batch, (step+1)·batch) of the shard's stream. A pure function of (samples, options,
  /// step, batch): it neither reads nor moves the position. Fails when step·batch overflows.
  result<std::vector<uint64_t>> batch_at_step(uint64_t step, uint64_t batch) const;

  /// The position as a few bytes (a version, the configuration it belongs to, epoch and offset
  /// as varints), to store beside a checkpoint.
  std::string save_position() const;

  /// Restores a position saved by `save_position` of a loader with the same samples, seed,
  /// shards, shard and layout; fails, naming both configurations, otherwise, and on malformed
  /// bytes. The position is unchanged on failure.
  status restore_position(std::string_view bytes);

private:
  sample_loader(uint64_t samples, const loader_options& opts, uint64_t begin, uint64_t end);

  uint64_t samples_;
  loader_options opts_;
  /// This shard's range of positions in the layout's order: [begin_, end_).
  uint64_t begin_;
  uint64_t end_;
  loader_position pos_;
};

/// The ids peer `opts.shard` of `opts.shards` trains at step `step` with batches of `batch`:
/// `sample_loader::batch_at_step` of a fresh loader. A pure function of (samples, seed, shards,
/// layout, step, peer), so a validator recomputes another peer's batch from public values.
result<std::vector<uint64_t>> batch_for_step(uint64_t samples, const loader_options& opts,
                                             uint64_t step, uint64_t batch);

} // namespace starling::kernels
