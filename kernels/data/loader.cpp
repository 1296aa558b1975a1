#include "kernels/data/loader.hpp"

#include "kernels/data/internal/varint.hpp"
#include "kernels/data/permutation.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace starling::kernels {

namespace {

/// Keys of independent permutations derived from one seed: the tags keep the layout's
/// permutation and the epochs' orders unrelated.
constexpr uint64_t layout_tag = 0x6c61796f7574ULL; // "layout"
constexpr uint64_t order_tag = 0x6f72646572ULL;    // "order"

/// Version byte of a saved position.
constexpr uint8_t position_version = 1;

/// The largest data set: the Feistel halves must fit in 31 bits each.
constexpr uint64_t max_samples = uint64_t{1} << 62;

/// N·k/S without overflow.
uint64_t split_point(uint64_t n, uint64_t k, uint64_t s) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(n) * k / s);
}

std::string describe_shard(uint64_t samples, uint64_t seed, uint64_t shards, uint64_t shard,
                           uint64_t layout) {
  const char* name = layout == 0 ? "contiguous" : layout == 1 ? "scattered" : "unknown";
  return fmt::format("shard {} of {} of {} samples, seed {}, {} layout", shard, shards, samples,
                     seed, name);
}

} // namespace

const char* to_string(shard_layout layout) noexcept {
  return layout == shard_layout::contiguous ? "contiguous" : "scattered";
}

sample_loader::sample_loader(uint64_t samples, const loader_options& opts, uint64_t begin,
                             uint64_t end)
    : samples_(samples), opts_(opts), begin_(begin), end_(end) {}

result<sample_loader> sample_loader::make(uint64_t samples, const loader_options& opts) {
  if (samples == 0)
    return fail("loader: the data set has no samples");
  if (samples > max_samples)
    return fail(fmt::format("loader: {} samples, at most 2^62 supported", samples));
  if (opts.shards == 0 || opts.shard >= opts.shards)
    return fail(fmt::format("loader: shard {} of {}, expected a shard in [0, shards) and at "
                            "least one shard",
                            opts.shard, opts.shards));
  if (opts.shards > samples)
    return fail(fmt::format("loader: {} shards of {} samples, expected at most one shard per "
                            "sample (a shard would be empty)",
                            opts.shards, samples));
  if (opts.layout != shard_layout::contiguous && opts.layout != shard_layout::scattered)
    return fail(fmt::format("loader: unknown shard layout {}", static_cast<int>(opts.layout)));
  return sample_loader(samples, opts, split_point(samples, opts.shard, opts.shards),
                       split_point(samples, opts.shard + 1, opts.shards));
}

uint64_t sample_loader::id_at(loader_position p) const noexcept {
  // Epoch order within the shard, then the shard's slot to a sample id.
  const feistel_permutation order(
      shard_size(),
      derive_key(derive_key(derive_key(opts_.seed, order_tag), opts_.shard), p.epoch));
  const uint64_t slot = begin_ + order(p.offset);
  if (opts_.layout == shard_layout::contiguous)
    return slot;
  const feistel_permutation layout(samples_, derive_key(opts_.seed, layout_tag));
  return layout(slot);
}

bool sample_loader::owns(uint64_t id) const noexcept {
  if (id >= samples_)
    return false;
  uint64_t slot = id;
  if (opts_.layout == shard_layout::scattered)
    slot = feistel_permutation(samples_, derive_key(opts_.seed, layout_tag)).inverse(id);
  return slot >= begin_ && slot < end_;
}

std::vector<uint64_t> sample_loader::next(uint64_t count) {
  std::vector<uint64_t> out;
  next_into(count, out);
  return out;
}

void sample_loader::next_into(uint64_t count, std::vector<uint64_t>& out) {
  out.reserve(out.size() + count);
  // One permutation object per epoch touched, not per id: its round keys cost 6 hashes.
  const feistel_permutation layout(samples_, derive_key(opts_.seed, layout_tag));
  while (count > 0) {
    const feistel_permutation order(
        shard_size(),
        derive_key(derive_key(derive_key(opts_.seed, order_tag), opts_.shard), pos_.epoch));
    const uint64_t take = std::min(count, shard_size() - pos_.offset);
    for (uint64_t i = 0; i < take; ++i) {
      const uint64_t slot = begin_ + order(pos_.offset + i);
      out.push_back(opts_.layout == shard_layout::contiguous ? slot : layout(slot));
    }
    pos_ = advanced(pos_, take);
    count -= take;
  }
}

status sample_loader::seek(loader_position p) {
  if (p.offset >= shard_size())
    return fail(fmt::format("loader: offset {} in epoch {}, expected an offset below the shard "
                            "size {}",
                            p.offset, p.epoch, shard_size()));
  pos_ = p;
  return {};
}

loader_position sample_loader::advanced(loader_position p, uint64_t count) const noexcept {
  const uint64_t size = shard_size();
  const unsigned __int128 index = static_cast<unsigned __int128>(p.epoch) * size + p.offset + count;
  return {static_cast<uint64_t>(index / size), static_cast<uint64_t>(index % size)};
}

result<std::vector<uint64_t>> sample_loader::batch_at_step(uint64_t step, uint64_t batch) const {
  uint64_t first = 0;
  if (__builtin_mul_overflow(step, batch, &first))
    return fail(fmt::format("loader: step {} × batch {} overflows 64 bits", step, batch));
  auto copy = *this;
  copy.pos_ = advanced({0, 0}, first);
  return copy.next(batch);
}

std::string sample_loader::save_position() const {
  std::string out;
  out.push_back(static_cast<char>(position_version));
  out.push_back(static_cast<char>(opts_.layout));
  internal::put_varint(out, samples_);
  internal::put_varint(out, opts_.seed);
  internal::put_varint(out, opts_.shards);
  internal::put_varint(out, opts_.shard);
  internal::put_varint(out, pos_.epoch);
  internal::put_varint(out, pos_.offset);
  return out;
}

status sample_loader::restore_position(std::string_view bytes) {
  internal::byte_reader in(bytes);
  uint8_t version = 0, layout = 0;
  uint64_t samples = 0, seed = 0, shards = 0, shard = 0;
  loader_position p;
  if (!in.byte(version))
    return fail("loader position: empty, expected the bytes save_position wrote");
  if (version != position_version)
    return fail(fmt::format("loader position: version {}, expected {}", version, position_version));
  if (!in.byte(layout) || !in.varint(samples) || !in.varint(seed) || !in.varint(shards) ||
      !in.varint(shard) || !in.varint(p.epoch) || !in.varint(p.offset))
    return fail(fmt::format("loader position: truncated or malformed after {} of {} bytes",
                            in.offset(), bytes.size()));
  if (!in.at_end())
    return fail(
        fmt::format("loader position: {} bytes follow the position", bytes.size() - in.offset()));
  if (samples != samples_ || seed != opts_.seed || shards != opts_.shards || shard != opts_.shard ||
      layout != static_cast<uint8_t>(opts_.layout))
    return fail(fmt::format("loader position: saved for {}, this loader is {}",
                            describe_shard(samples, seed, shards, shard, layout),
                            describe_shard(samples_, opts_.seed, opts_.shards, opts_.shard,
                                           static_cast<uint64_t>(opts_.layout))));
  return seek(p);
}

result<std::vector<uint64_t>> batch_for_step(uint64_t samples, const loader_options& opts,
                                             uint64_t step, uint64_t batch) {
  auto loader = sample_loader::make(samples, opts);
  if (!loader)
    return loader.error();
  return loader->batch_at_step(step, batch);
}

} // namespace starling::kernels
