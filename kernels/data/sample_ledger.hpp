// Which samples were trained, and how often: the exactly-once accounting behind a run summary's
// "N samples trained once, none twice". Compact for data sets of ~10^8 samples, mergeable across
// peers, serializable beside a checkpoint. No LibTorch.
#pragma once

#include "kernels/result.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace starling::kernels {

/// How a ledger's counts spread over its ids.
struct ledger_summary {
  /// Ids in the ledger's range [0, samples).
  uint64_t samples = 0;
  /// Ids never recorded.
  uint64_t never = 0;
  /// Ids recorded exactly once.
  uint64_t once = 0;
  /// Ids recorded more than once.
  uint64_t more = 0;
  /// Recordings in all (once + the repeats).
  uint64_t records = 0;
  /// The highest count of any id (0 when empty).
  uint64_t max_count = 0;

  /// "12 samples trained once, none twice or more, 988 not trained (of 1000)".
  std::string describe() const;
};

/// Where a ledger of what was trained differs from one of what should have been.
struct ledger_comparison {
  /// Ids trained exactly as often as expected (expected at least once).
  uint64_t exact = 0;
  /// Ids trained fewer times than expected: lost work.
  uint64_t missing = 0;
  /// Ids trained more times than expected: duplicates, or samples never handed out.
  uint64_t extra = 0;
  /// The smallest missing ids (at most 8), for messages.
  std::vector<uint64_t> first_missing;
  /// The smallest extra ids (at most 8), for messages.
  std::vector<uint64_t> first_extra;

  /// True when every id was trained exactly as often as expected.
  bool ok() const noexcept { return missing == 0 && extra == 0; }

  /// "1000 samples trained as expected, 2 missing (ids 5, 9), none extra".
  std::string describe() const;
};

/// A count per sample id in [0, samples).
///
/// Storage: which ids were seen at least once lives in chunks of 2^16 ids, each a sorted array
/// of 16-bit offsets while it holds fewer than 4096 ids (2 bytes an id: a shard's ledger
/// under the scattered layout costs ~2·N/S bytes), a 8 KiB bitmap above that, and nothing
/// but a flag once full (a finished epoch costs a few bytes per 65536 ids). Counts above one
/// live in a sparse map, since duplicates are what the run must not have.
class sample_ledger {
public:
  /// An empty ledger of ids [0, samples).
  explicit sample_ledger(uint64_t samples = 0);

  /// The size of the id range.
  uint64_t samples() const noexcept { return samples_; }

  /// Counts `id` `times` more times; fails when `id` is not below `samples()`.
  status record(uint64_t id, uint64_t times = 1);

  /// Counts each of `ids` once; fails at the first id out of range (the ids before it count).
  status record(const std::vector<uint64_t>& ids);

  /// Adds every count of `other`; fails when the ranges differ.
  status merge(const sample_ledger& other);

  /// How often `id` was recorded.
  uint64_t count(uint64_t id) const;

  /// Counts by multiplicity over the whole range.
  ledger_summary summary() const;

  /// Bytes: a version, the range, the chunks (full / array / bitmap) and the repeats, as
  /// varints where it helps. A full ledger of 10^8 ids takes a few KiB.
  std::string serialize() const;

  /// A ledger from `serialize`'s bytes; fails on malformed input (unknown version or chunk kind,
  /// ids out of range, unsorted arrays, counts that disagree, trailing bytes).
  static result<sample_ledger> parse(std::string_view bytes);

  /// Approximate heap bytes held (chunks and repeats), for reports.
  uint64_t memory_bytes() const;

  /// Ids a chunk covers.
  static constexpr uint64_t chunk_ids = uint64_t{1} << 16;

private:
  /// The ids seen in [index·2^16, index·2^16 + capacity).
  struct chunk {
    /// Ids present.
    uint32_t cardinality = 0;
    /// Present offsets, sorted, while the chunk is an array.
    std::vector<uint16_t> array;
    /// 1024 words when the chunk is a bitmap; empty otherwise.
    std::vector<uint64_t> bits;

    bool is_bitmap() const { return !bits.empty(); }
  };

  friend ledger_comparison compare(const sample_ledger& trained, const sample_ledger& expected);

  /// Ids chunk `index` can hold (less than 2^16 for the last one).
  uint64_t capacity(uint64_t index) const;
  /// Marks offset `off` of chunk `index` seen; false when it already was.
  bool insert(uint64_t index, uint16_t off);
  /// The chunk's presence as 1024 words (all ones up to the capacity when full).
  void to_bitmap(uint64_t index, const chunk& c, std::vector<uint64_t>& words) const;
  /// Replaces chunk `index` by `words` in the cheapest form.
  void assign(uint64_t index, const std::vector<uint64_t>& words);
  /// Whether offset `off` of chunk `c` (of chunk `index`) is present.
  bool contains(uint64_t index, const chunk& c, uint16_t off) const;

  uint64_t samples_;
  std::map<uint64_t, chunk> chunks_;
  /// id -> count - 1, for ids counted more than once.
  std::map<uint64_t, uint64_t> repeats_;
};

/// Compares what was trained with what should have been (e.g. the ledger of every id the
/// loaders handed out): per id, equal counts are exact, fewer are missing, more are extra.
/// Ledgers of different ranges compare over the larger one.
ledger_comparison compare(const sample_ledger& trained, const sample_ledger& expected);

} // namespace starling::kernels
