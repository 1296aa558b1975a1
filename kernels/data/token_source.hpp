// Windows of a token file as samples: the data of a GPT trained on a tokenized corpus.
#pragma once

#include "kernels/data/data_source.hpp"
#include "kernels/data/token_file.hpp"

#include <memory>

namespace starling::kernels {

/// A token file and how it is cut into samples.
struct token_source_options {
  /// The file, its dtype and the vocabulary its ids must stay below.
  token_file_options file;
  /// Tokens of input per sample (the model's context); a sample reads seq_len + 1 tokens.
  int64_t seq_len = 128;
  /// Tokens between consecutive samples' starts; 0 means seq_len (samples cover the file once).
  int64_t stride = 0;
};

/// Sample i is tokens [i·stride, i·stride + seq_len + 1) of the file: inputs int64
/// [B, seq_len], targets the same shifted by one token. A held-out set is a second file (as
/// GPT pipelines write train.bin and val.bin).
class token_source : public data_source {
public:
  /// Opens `opts.file` (see `token_file::open` for its errors) and cuts it into windows; fails
  /// on seq_len < 1, stride < 0, or a file shorter than one window, naming the file.
  static result<std::shared_ptr<const token_source>> make(const token_source_options& opts);

  /// Number of windows.
  uint64_t size() const override { return windows_; }

  /// "tokens <path> (uint16, N tokens, vocabulary V, windows of T+1 tokens every S)".
  std::string describe() const override;

  /// {seq_len} token ids; the vocabulary's classes.
  sample_shape shape() const override;

  /// The windows `ids`; fails on an out-of-vocabulary id when the file was not validated at
  /// open.
  result<sample_batch> batch(const std::vector<uint64_t>& ids) const override;

  /// The file.
  const token_file& file() const noexcept { return file_; }

  /// The options in force (stride resolved).
  const token_source_options& options() const noexcept { return opts_; }

private:
  token_source(token_file file, const token_source_options& opts, uint64_t windows);

  token_file file_;
  token_source_options opts_;
  uint64_t windows_;
};

} // namespace starling::kernels
