#include "kernels/data/batch_progress.hpp"

#include "kernels/data/internal/varint.hpp"

#include <fmt/format.h>

namespace starling::kernels {

namespace {

/// Version byte of serialized progress.
constexpr uint8_t progress_version = 1;

} // namespace

batch_progress::batch_progress(uint64_t total) : total_(total) {}

bool batch_progress::done(uint64_t batch) const {
  return batch < watermark_ || above_.count(batch) > 0;
}

result<bool> batch_progress::mark_done(uint64_t batch) {
  if (batch >= total_)
    return fail(fmt::format("batch {} is out of range: a shard of {} batches", batch, total_));
  if (done(batch))
    return false;
  if (batch != watermark_) {
    above_.insert(batch);
    return true;
  }
  // The watermark moves past every done batch that now follows it.
  ++watermark_;
  while (!above_.empty() && *above_.begin() == watermark_) {
    above_.erase(above_.begin());
    ++watermark_;
  }
  return true;
}

uint64_t batch_progress::next_undone(uint64_t from) const {
  auto b = std::max(from, watermark_);
  for (auto i = above_.lower_bound(b); i != above_.end() && *i == b; ++i)
    ++b;
  return std::min(b, total_);
}

std::string batch_progress::serialize() const {
  std::string out;
  out.push_back(static_cast<char>(progress_version));
  internal::put_varint(out, total_);
  internal::put_varint(out, watermark_);
  internal::put_varint(out, above_.size());
  // Gaps from the previous done batch (the watermark for the first), minus one: batches done in
  // a burst after the watermark cost a byte each.
  auto prev = watermark_;
  for (auto b : above_) {
    internal::put_varint(out, b - prev - 1);
    prev = b;
  }
  return out;
}

result<batch_progress> batch_progress::parse(std::string_view bytes) {
  internal::byte_reader in{bytes};
  uint8_t version = 0;
  if (!in.byte(version))
    return fail("batch progress: no bytes");
  if (version != progress_version)
    return fail(fmt::format("batch progress: version {}, expected {}", version, progress_version));
  uint64_t total = 0, watermark = 0, count = 0;
  if (!in.varint(total) || !in.varint(watermark) || !in.varint(count))
    return fail("batch progress: truncated header");
  if (watermark > total)
    return fail(fmt::format("batch progress: watermark {} past the total {}", watermark, total));
  if (count > total - watermark)
    return fail(fmt::format("batch progress: {} batches above watermark {} of a total {}", count,
                            watermark, total));
  batch_progress p{total};
  p.watermark_ = watermark;
  auto prev = watermark;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t gap = 0;
    if (!in.varint(gap))
      return fail(fmt::format("batch progress: truncated at done batch {} of {}", i, count));
    if (gap >= total - prev - 1)
      return fail(fmt::format("batch progress: done batch past the total {}", total));
    prev += gap + 1;
    p.above_.insert(p.above_.end(), prev);
  }
  if (!in.at_end())
    return fail(fmt::format("batch progress: {} trailing bytes", bytes.size() - in.offset()));
  return p;
}

} // namespace starling::kernels
