#include "kernels/data/text_source.hpp"

#include "kernels/data/internal/windows.hpp"

#include <fmt/format.h>

namespace starling::kernels {

text_source::text_source(std::shared_ptr<const corpus> text, const text_source_options& opts,
                         uint64_t windows)
    : text_(std::move(text)), opts_(opts), windows_(windows) {}

result<std::shared_ptr<const text_source>> text_source::make(std::shared_ptr<const corpus> text,
                                                             const text_source_options& opts) {
  if (text == nullptr)
    return fail("text source: no corpus");
  if (opts.seq_len < 1 || opts.stride < 0)
    return fail(fmt::format("text source: seq_len {} and stride {}, expected seq_len >= 1 and "
                            "stride >= 0 (0: seq_len)",
                            opts.seq_len, opts.stride));
  auto resolved = opts;
  if (resolved.stride == 0)
    resolved.stride = resolved.seq_len;
  const uint64_t windows = internal::window_count(static_cast<uint64_t>(text->train_size()),
                                                  resolved.seq_len, resolved.stride);
  if (windows == 0)
    return fail(fmt::format("text source {}: {} bytes for training, fewer than one window of {} "
                            "(seq_len {} + 1)",
                            text->source(), text->train_size(), resolved.seq_len + 1,
                            resolved.seq_len));
  return std::shared_ptr<const text_source>(new text_source(std::move(text), resolved, windows));
}

std::string text_source::describe() const {
  return fmt::format("text {} ({} bytes for training, {} windows of {} bytes every {})",
                     text_->source(), text_->train_size(), windows_, opts_.seq_len + 1,
                     opts_.stride);
}

sample_shape text_source::shape() const {
  return {{opts_.seq_len}, 256};
}

result<sample_batch> text_source::batch(const std::vector<uint64_t>& ids) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text_->text().data());
  return internal::stack_windows(ids, windows_, opts_.seq_len, opts_.stride,
                                 "text source " + text_->source(),
                                 [&](uint64_t start, uint64_t count, int64_t* out) -> status {
                                   for (uint64_t k = 0; k < count; ++k)
                                     out[k] = bytes[start + k];
                                   return {};
                                 });
}

} // namespace starling::kernels
