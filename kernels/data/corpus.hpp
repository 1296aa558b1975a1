// A byte-level text corpus with a held-out tail, and a seeded sampler of (inputs, targets) batches
// over disjoint per-trainer shards of the training part.
#pragma once

#include "kernels/result.hpp"

#include "kernels/torch_fwd.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <utility>

namespace starling::kernels {

/// Where the text comes from.
struct corpus_options {
  /// Shell command printing the King James Bible, one verse per line with a reference prefix
  /// (`Ge1:1 In the beginning...`). Injectable so tests can stand in for an absent `bible`.
  std::string bible_command = "bible -f \"Gen1:1-Rev22:21\" 2>/dev/null";
  /// Directory whose `*.txt` files (concatenated in name order) are used when the command fails
  /// or prints nothing.
  std::string fallback_dir = "examples/data";
  /// Fraction of the text, taken from its end, held out for evaluation.
  double held_out_fraction = 0.05;
};

/// Bytes of text split into a training part `[0, train_size())` and a held-out tail.
class corpus {
public:
  /// A corpus over `text` with its last `held_out_fraction` held out; `source` says where it came
  /// from (for logs).
  corpus(std::string text, double held_out_fraction, std::string source);

  /// The whole text.
  const std::string& text() const noexcept { return text_; }

  /// Bytes available for training (the held-out tail starts here).
  int64_t train_size() const noexcept { return train_size_; }

  /// Total bytes.
  int64_t size() const noexcept { return static_cast<int64_t>(text_.size()); }

  /// "bible" or the fallback directory's path.
  const std::string& source() const noexcept { return source_; }

private:
  std::string text_;
  int64_t train_size_;
  std::string source_;
};

/// Runs `command` and returns its standard output; fails when it cannot run or exits non-zero.
result<std::string> run_command(const std::string& command);

/// Removes the verse reference (`Ge1:1 `, `1Cor13:4 `, ...) at the start of every line.
std::string strip_verse_prefixes(const std::string& text);

/// The Bible via `opts.bible_command` when it works, else the fallback directory's text; fails
/// when neither gives any text or the held-out fraction is not in [0, 1).
result<corpus> load_corpus(const corpus_options& opts);

/// One batch: `inputs` and `targets` int64 [B, T], targets being inputs shifted by one byte.
struct text_batch {
  /// Bytes t .. t+T-1 of each window.
  torch::Tensor inputs;
  /// Bytes t+1 .. t+T of each window.
  torch::Tensor targets;
};

/// Draws random windows of a corpus' training part, restricted to shard `shard` of `shards` equal
/// contiguous ranges, so trainers with different shards never read the same byte; held-out bytes
/// are never drawn.
class text_sampler {
public:
  /// A sampler of batches of `batch` windows of `seq_len` (+1 for the targets) bytes.
  static result<text_sampler> make(const corpus& c, int64_t shard, int64_t shards, int64_t batch,
                                   int64_t seq_len);

  /// A batch drawn with `gen`: the same generator state gives the same batch.
  text_batch sample(std::mt19937_64& gen) const;

  /// Byte range [first, second) of the corpus this sampler reads from.
  std::pair<int64_t, int64_t> range() const noexcept { return {begin_, end_}; }

private:
  text_sampler(const corpus& c, int64_t begin, int64_t end, int64_t batch, int64_t seq_len);

  const corpus* corpus_;
  int64_t begin_;
  int64_t end_;
  int64_t batch_;
  int64_t seq_len_;
};

/// Consecutive non-overlapping windows of the held-out tail, `batch` per batch, at most
/// `max_batches` batches: a fixed evaluation set. Fails when the tail is shorter than one window.
result<std::vector<text_batch>> held_out_batches(const corpus& c, int64_t batch, int64_t seq_len,
                                                 int64_t max_batches);

} // namespace starling::kernels
