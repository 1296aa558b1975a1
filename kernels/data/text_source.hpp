// Windows of a byte-level text corpus' training part as samples (the built-in GPT's data).
#pragma once

#include "kernels/data/corpus.hpp"
#include "kernels/data/data_source.hpp"

#include <memory>

namespace starling::kernels {

/// How a text is cut into samples.
struct text_source_options {
  /// Bytes of input per sample (the model's context); a sample reads seq_len + 1 bytes.
  int64_t seq_len = 128;
  /// Bytes between consecutive samples' starts; 0 means seq_len, so samples cover the text
  /// once and neighbours share one byte (the last target of one is the first input of the next).
  int64_t stride = 0;
};

/// Sample i is bytes [i·stride, i·stride + seq_len + 1) of the corpus' training part: inputs
/// int64 [B, seq_len], targets the same shifted by one byte. The held-out tail is never read
/// (see `held_out_batches`).
class text_source : public data_source {
public:
  /// A source over `text`'s training part; fails on seq_len < 1, stride < 0, or a training
  /// part shorter than one window.
  static result<std::shared_ptr<const text_source>> make(std::shared_ptr<const corpus> text,
                                                         const text_source_options& opts);

  /// Number of windows.
  uint64_t size() const override { return windows_; }

  /// "text <source> (N bytes for training, windows of T+1 bytes every S)".
  std::string describe() const override;

  /// {seq_len} bytes; 256 classes (every byte value).
  sample_shape shape() const override;

  /// The windows `ids`.
  result<sample_batch> batch(const std::vector<uint64_t>& ids) const override;

  /// The options in force (stride resolved).
  const text_source_options& options() const noexcept { return opts_; }

private:
  text_source(std::shared_ptr<const corpus> text, const text_source_options& opts,
              uint64_t windows);

  std::shared_ptr<const corpus> text_;
  text_source_options opts_;
  uint64_t windows_;
};

} // namespace starling::kernels
