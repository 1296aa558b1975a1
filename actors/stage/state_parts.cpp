#include "actors/stage/state_parts.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <sodium.h>
#include <torch/torch.h>

namespace starling::actors::stage {

namespace {

uint64_t numel_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) : 0;
}

/// Slice `part` of `parts` of `t` flattened (undefined stays undefined).
messages::tensor_msg slice_of(const torch::Tensor& t, uint64_t part, uint64_t parts) {
  messages::tensor_msg out;
  out.codec = kernels::codec_id::none; // a state travels exactly
  if (!t.defined())
    return out;
  auto flat = t.reshape({-1});
  auto [b, e] = part_range(static_cast<uint64_t>(flat.numel()), part, parts);
  out.tensor = flat.slice(0, static_cast<int64_t>(b), static_cast<int64_t>(e));
  return out;
}

/// Concatenates the slices `get(part)` of parts in index order into a tensor of `total`
/// elements of `dtype`, checking every slice's length and dtype.
template <class Get>
result<torch::Tensor> join_slices(const std::vector<const messages::stage_state_part*>& by_index,
                                  uint64_t total, int32_t dtype, const char* what, Get get) {
  auto n = by_index.size();
  if (total == 0) {
    for (uint64_t i = 0; i < n; ++i)
      if (numel_of(get(*by_index[i]).tensor) > 0)
        return fail(fmt::format("part {} holds {} of a state that has none", i, what));
    return torch::Tensor{};
  }
  if (dtype < 0 || dtype >= static_cast<int32_t>(c10::ScalarType::NumOptions))
    return fail(fmt::format("unknown {} dtype {}", what, dtype));
  std::vector<torch::Tensor> slices;
  for (uint64_t i = 0; i < n; ++i) {
    const auto& m = get(*by_index[i]);
    if (!m.ok())
      return fail(fmt::format("part {}'s {} did not decode: {}", i, what, m.error));
    auto [b, e] = part_range(total, i, n);
    auto len = numel_of(m.tensor);
    if (len != e - b)
      return fail(fmt::format("part {} holds {} elements of {}, its range has {}", i, len, what,
                              e - b));
    if (len == 0)
      continue;
    if (static_cast<int32_t>(m.tensor.scalar_type()) != dtype)
      return fail(fmt::format("part {}'s {} have dtype {}, the state says {}", i, what,
                              static_cast<int>(m.tensor.scalar_type()), dtype));
    slices.push_back(m.tensor.reshape({-1}));
  }
  return torch::cat(slices).contiguous();
}

} // namespace

std::pair<uint64_t, uint64_t> part_range(uint64_t total, uint64_t part, uint64_t parts) {
  auto base = total / parts;
  auto extra = total % parts;
  auto begin = part * base + std::min(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

std::string state_digest(const messages::stage_state& s) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, crypto_generichash_BYTES);
  auto feed = [&](const void* data, size_t size) {
    if (size > 0)
      crypto_generichash_update(&h, static_cast<const unsigned char*>(data), size);
  };
  // Every length before its bytes, so that moving bytes between the fields changes the digest.
  auto feed_tensor = [&](const torch::Tensor& t) {
    // An empty tensor counts as none (an assembled state has no tensor where the whole had none).
    bool any = t.defined() && t.numel() > 0;
    auto c = any ? t.contiguous() : torch::Tensor{};
    uint64_t bytes = any ? static_cast<uint64_t>(c.numel() * c.element_size()) : 0;
    int32_t dtype = any ? static_cast<int32_t>(c.scalar_type()) : -1;
    feed(&bytes, sizeof bytes);
    feed(&dtype, sizeof dtype);
    if (bytes > 0)
      feed(c.data_ptr(), bytes);
  };
  feed(&s.steps, sizeof s.steps);
  feed_tensor(s.params.tensor);
  feed_tensor(s.moments.tensor);
  uint64_t count = s.optimizer_steps.size();
  feed(&count, sizeof count);
  feed(s.optimizer_steps.data(), count * sizeof(uint64_t));
  // Buffers only when the state has some, so that a model without them (and every cost-model
  // peer) keeps the digest it had before buffers travelled.
  bool buffers = (s.buffers.tensor.defined() && s.buffers.tensor.numel() > 0)
                 || (s.int_buffers.tensor.defined() && s.int_buffers.tensor.numel() > 0);
  if (buffers) {
    feed_tensor(s.buffers.tensor);
    feed_tensor(s.int_buffers.tensor);
  }
  // A compact optimizer state (lamb8) likewise only when there is one.
  if (!s.packed_moments.empty()) {
    uint64_t packed = s.packed_moments.size();
    feed(&packed, sizeof packed);
    feed(s.packed_moments.data(), s.packed_moments.size());
  }
  std::string out(crypto_generichash_BYTES, '\0');
  crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(out.data()), out.size());
  return out;
}

result<messages::stage_state_part> cut_state_part(const messages::stage_state& whole,
                                                  const std::string& digest, uint64_t part,
                                                  uint64_t parts) {
  if (parts < 1 || parts > max_state_parts)
    return fail(fmt::format("a state is cut into 1 to {} parts, not {}", max_state_parts, parts));
  if (part >= parts)
    return fail(fmt::format("part {} of {} does not exist (parts count from 0)", part, parts));
  messages::stage_state_part out;
  out.steps = whole.steps;
  out.samples = whole.samples;
  out.part = part;
  out.parts = parts;
  out.digest = digest;
  const auto& p = whole.params.tensor;
  out.params_numel = numel_of(p);
  out.params_dtype = p.defined() ? static_cast<int32_t>(p.scalar_type()) : -1;
  out.params = slice_of(p, part, parts);
  const auto& m = whole.moments.tensor;
  if (m.defined() && m.numel() > 0 && m.scalar_type() != torch::kFloat)
    return fail("optimizer moments must be fp32");
  out.moments_numel = numel_of(m);
  out.moments = slice_of(m, part, parts);
  out.optimizer_steps = whole.optimizer_steps;
  out.packed_bytes = whole.packed_moments.size();
  auto [pb, pe] = part_range(out.packed_bytes, part, parts);
  out.packed_moments = whole.packed_moments.substr(pb, pe - pb);
  out.buffers = whole.buffers;
  out.int_buffers = whole.int_buffers;
  out.buffers.codec = out.int_buffers.codec = kernels::codec_id::none;
  auto [mb, me] = part_range(whole.modeled.size, part, parts);
  out.modeled.size = me - mb;
  return out;
}

result<messages::stage_state> assemble_state(
  const std::vector<messages::stage_state_part>& parts) {
  if (parts.empty())
    return fail("no parts to assemble a state from");
  const auto& first = parts.front();
  auto n = first.parts;
  if (n < 1 || n > max_state_parts)
    return fail(fmt::format("a state is cut into 1 to {} parts, not {}", max_state_parts, n));
  if (parts.size() != n)
    return fail(fmt::format("{} parts of a state cut into {}", parts.size(), n));
  std::vector<const messages::stage_state_part*> by_index(n, nullptr);
  for (const auto& p : parts) {
    if (p.parts != n || p.steps != first.steps || p.params_numel != first.params_numel
        || p.params_dtype != first.params_dtype || p.moments_numel != first.moments_numel
        || p.optimizer_steps != first.optimizer_steps || p.digest != first.digest
        || p.packed_bytes != first.packed_bytes)
      return fail(fmt::format("the donors sent parts of different states (step {} and step {}, "
                              "or different sizes or digests)",
                              first.steps, p.steps));
    if (p.part >= n)
      return fail(fmt::format("part {} of {} does not exist", p.part, n));
    if (by_index[p.part] != nullptr)
      return fail(fmt::format("part {} arrived twice", p.part));
    by_index[p.part] = &p;
  }
  messages::stage_state out;
  out.steps = first.steps;
  out.samples = first.samples;
  out.optimizer_steps = first.optimizer_steps;
  auto params = join_slices(by_index, first.params_numel, first.params_dtype, "parameters",
                            [](const messages::stage_state_part& p) -> const auto& {
                              return p.params;
                            });
  if (!params.ok())
    return params.error();
  auto moments = join_slices(by_index, first.moments_numel,
                             static_cast<int32_t>(torch::kFloat), "optimizer moments",
                             [](const messages::stage_state_part& p) -> const auto& {
                               return p.moments;
                             });
  if (!moments.ok())
    return moments.error();
  out.params.tensor = *params;
  out.params.codec = kernels::codec_id::none;
  out.moments.tensor = *moments;
  out.moments.codec = kernels::codec_id::none;
  for (uint64_t i = 0; i < n; ++i) {
    auto [b, e] = part_range(first.packed_bytes, i, n);
    const auto& slice = by_index[i]->packed_moments;
    if (slice.size() != e - b)
      return fail(fmt::format("part {} holds {} bytes of the compact optimizer state, {} expected",
                              i, slice.size(), e - b));
    out.packed_moments += slice;
  }
  // Every part carries the whole buffers; the digest below says whether they are the donors'.
  for (const auto* m : {&first.buffers, &first.int_buffers})
    if (!m->ok())
      return fail(fmt::format("the buffers did not decode: {}", m->error));
  out.buffers = first.buffers;
  out.int_buffers = first.int_buffers;
  for (const auto& p : parts)
    out.modeled.size += p.modeled.size;
  if (state_digest(out) != first.digest)
    return fail("the assembled state does not match the donors' digest");
  return out;
}

} // namespace starling::actors::stage
