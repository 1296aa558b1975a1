#include "kernels/data/token_source.hpp"

#include "kernels/data/internal/windows.hpp"

#include <fmt/format.h>

namespace starling::kernels {

token_source::token_source(token_file file, const token_source_options& opts, uint64_t windows)
    : file_(std::move(file)), opts_(opts), windows_(windows) {}

result<std::shared_ptr<const token_source>> token_source::make(const token_source_options& opts) {
  if (opts.seq_len < 1 || opts.stride < 0)
    return fail(fmt::format("token file {}: seq_len {} and stride {}, expected seq_len >= 1 and "
                            "stride >= 0 (0: seq_len)",
                            opts.file.path, opts.seq_len, opts.stride));
  auto file = token_file::open(opts.file);
  if (!file)
    return file.error();
  auto resolved = opts;
  if (resolved.stride == 0)
    resolved.stride = resolved.seq_len;
  const uint64_t windows = internal::window_count(file->size(), resolved.seq_len, resolved.stride);
  if (windows == 0)
    return fail(fmt::format("token file {}: {} tokens, fewer than one window of {} (seq_len {} "
                            "+ 1)",
                            opts.file.path, file->size(), resolved.seq_len + 1, resolved.seq_len));
  return std::shared_ptr<const token_source>(new token_source(std::move(*file), resolved, windows));
}

std::string token_source::describe() const {
  return fmt::format("tokens {} ({}, {} tokens, vocabulary {}, {} windows of {} tokens every {})",
                     opts_.file.path, to_string(opts_.file.dtype), file_.size(),
                     opts_.file.vocab_size, windows_, opts_.seq_len + 1, opts_.stride);
}

sample_shape token_source::shape() const {
  return {{opts_.seq_len}, static_cast<int64_t>(opts_.file.vocab_size)};
}

result<sample_batch> token_source::batch(const std::vector<uint64_t>& ids) const {
  return internal::stack_windows(
      ids, windows_, opts_.seq_len, opts_.stride, "token file " + opts_.file.path,
      [&](uint64_t start, uint64_t count, int64_t* out) { return file_.read(start, count, out); });
}

} // namespace starling::kernels
