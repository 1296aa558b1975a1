// Token files as GPT training pipelines write them: a raw array of little-endian uint16 or
// uint32 token ids, no header (nanoGPT's train.bin). Memory-mapped, validated against the
// model's vocabulary with errors that name the file, the offset and the id. No LibTorch.
#pragma once

#include "kernels/result.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace starling::kernels {

/// The element type of a token file.
enum class token_dtype : uint8_t {
  /// 2 bytes a token: vocabularies up to 65536 (GPT-2's 50257).
  uint16 = 2,
  /// 4 bytes a token: larger vocabularies.
  uint32 = 4,
};

/// "uint16" or "uint32".
const char* to_string(token_dtype dtype) noexcept;

/// The dtype named `name` ("uint16", "uint32"); fails naming what was expected.
result<token_dtype> parse_token_dtype(std::string_view name);

/// Bytes a token of `dtype` takes.
inline std::size_t token_width(token_dtype dtype) noexcept {
  return static_cast<std::size_t>(dtype);
}

/// Which file, and how to check it.
struct token_file_options {
  /// Path of the token file (required).
  std::string path;
  /// Element type; uint16 by default, as most GPT pipelines write.
  token_dtype dtype = token_dtype::uint16;
  /// The model's vocabulary size: every token must be below it. Required (0 is refused): an
  /// unchecked out-of-vocabulary id would fail later inside an embedding, far from its cause.
  uint64_t vocab_size = 0;
  /// Check every token when opening (one pass, ~0.1 s per 10^8 tokens); when false, each read
  /// checks the tokens it returns instead, with the same message.
  bool validate_at_open = true;
};

/// A read-only memory-mapped token file.
class token_file {
public:
  /// Opens and validates `opts.path`. One clear error each for: no path, a vocabulary size of 0,
  /// a missing file, a file that cannot be opened or mapped, an empty file, a size that is not a
  /// multiple of the token width, and (when `validate_at_open`) the first out-of-vocabulary id.
  static result<token_file> open(const token_file_options& opts);

  token_file(token_file&& other) noexcept;
  token_file& operator=(token_file&& other) noexcept;
  token_file(const token_file&) = delete;
  token_file& operator=(const token_file&) = delete;
  ~token_file();

  /// Number of tokens.
  uint64_t size() const noexcept { return tokens_; }

  /// The options it was opened with.
  const token_file_options& options() const noexcept { return opts_; }

  /// Token `i` (i < size()), unchecked against the vocabulary.
  uint32_t at(uint64_t i) const noexcept;

  /// Copies tokens [first, first + count) into `out` as int64 (the dtype of embedding indices).
  /// Fails when the range passes the end, or (without validation at open) on an
  /// out-of-vocabulary id, naming the file, the offset and the id.
  status read(uint64_t first, uint64_t count, int64_t* out) const;

private:
  token_file(token_file_options opts, const unsigned char* data, std::size_t bytes);

  /// The error for token `i` with id `id` not below the vocabulary size.
  failure out_of_vocabulary(uint64_t i, uint32_t id) const;

  token_file_options opts_;
  const unsigned char* data_ = nullptr;
  std::size_t bytes_ = 0;
  uint64_t tokens_ = 0;
};

/// Writes `tokens` to `path` as little-endian `dtype` (for tests and examples); fails when a
/// token does not fit the dtype or the file cannot be written.
status write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                        token_dtype dtype);

} // namespace starling::kernels
