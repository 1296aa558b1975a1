#include "actors/averager/sparse_parts.hpp"

#include <cmath>
#include <cstring>
#include <exception>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/averager/butterfly.hpp"
#include "actors/collab/sparse_pack.hpp"
#include "kernels/compress/codec.hpp"

namespace starling::actors::averager {

namespace {

/// Appends `v` as a LEB128 varint (7 bits a byte, low bits first).
void put_count(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

/// Reads one varint of at most 9 bytes (63 bits) at `p` before `end`.
result<uint64_t> get_count(const uint8_t*& p, const uint8_t* end) {
  uint64_t v = 0;
  for (int shift = 0; shift < 63; shift += 7) {
    if (p == end)
      return fail("a sparse chunk is cut off in its counts");
    uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0)
      return v;
  }
  return fail("a sparse chunk's count is longer than 9 bytes");
}

/// The Top-k header of a chunk of `numel` elements keeping `k` of them.
result<kernels::tensor_header> sparse_header(int64_t numel, uint64_t k) {
  kernels::tensor_header h;
  h.dtype = kernels::wire_dtype::float32;
  h.shape = {numel};
  h.codec = kernels::codec_id::topk;
  kernels::codec_params p;
  p.k = k;
  auto resolved = kernels::resolve_params(numel, kernels::codec_id::topk, p);
  if (!resolved)
    return resolved.error();
  h.params = *resolved;
  return h;
}

} // namespace

result<std::vector<uint8_t>> encode_sparse_chunk(const at::Tensor& values) {
  try {
    if (!values.defined() || values.dim() != 1 || values.numel() == 0)
      return fail("a sparse chunk must be a non-empty 1-D tensor");
    auto x = values.to(torch::kFloat).contiguous();
    if (!all_finite(x))
      return fail("a sparse chunk must be finite");
    auto numel = x.numel();
    auto idx = torch::nonzero(x).reshape({-1});
    if (idx.numel() == 0) // Top-k keeps at least one coordinate: a zero one
      idx = torch::zeros({1}, torch::kLong);
    auto k = static_cast<uint64_t>(idx.numel());
    auto h = sparse_header(numel, k);
    if (!h)
      return h.error();
    size_t ib = h->params.index_bits / 8;
    auto kept = x.index_select(0, idx).contiguous();
    auto wide = h->params.index_bits == 32 ? idx.to(torch::kInt).contiguous() : idx.contiguous();
    std::vector<uint8_t> payload(k * ib + k * 4);
    std::memcpy(payload.data(), wide.data_ptr(), k * ib);
    std::memcpy(payload.data() + k * ib, kept.data_ptr<float>(), k * 4);
    auto packed = collab::pack_payload(*h, payload.data(), payload.size());
    if (!packed)
      return packed.error();
    std::vector<uint8_t> out;
    out.reserve(packed->size() + 12);
    put_count(out, static_cast<uint64_t>(numel));
    put_count(out, k);
    out.insert(out.end(), packed->begin(), packed->end());
    return out;
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot encode a sparse chunk: {}", e.what()));
  }
}

result<at::Tensor> decode_sparse_chunk(const uint8_t* data, size_t size, int64_t max_numel) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  auto n = get_count(p, end);
  if (!n)
    return n.error();
  auto kept = get_count(p, end);
  if (!kept)
    return kept.error();
  auto numel = *n;
  auto k = *kept;
  if (numel == 0 || max_numel <= 0 || numel > static_cast<uint64_t>(max_numel))
    return fail(
        fmt::format("a sparse chunk of {} elements, at most {} expected", numel, max_numel));
  if (k == 0 || k > numel)
    return fail(fmt::format("a sparse chunk keeps {} of {} elements", k, numel));
  auto h = sparse_header(static_cast<int64_t>(numel), k);
  if (!h)
    return h.error();
  auto payload = collab::unpack_payload(*h, p, static_cast<size_t>(end - p));
  if (!payload)
    return payload.error();
  auto t = kernels::decode_payload(*h, payload->data(), payload->size());
  if (!t)
    return t.error();
  try {
    auto f = t->to(torch::kFloat).reshape({-1});
    if (!all_finite(f))
      return fail("a sparse chunk holds values that are not finite");
    return f;
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot decode a sparse chunk: {}", e.what()));
  }
}

sparse_part_finisher::sparse_part_finisher(double ratio, bool error_feedback)
    : ratio_(ratio), ef_(error_feedback) {
  // The residual is sized by the first part's vector.
}

status sparse_part_finisher::finish(int64_t numel, int64_t offset, at::Tensor& values) {
  if (!values.defined() || values.dim() != 1 || offset < 0 || numel < 0 ||
      values.numel() > numel - offset)
    return fail(fmt::format("a part at {} of {} elements does not fit a vector of {}", offset,
                            values.defined() ? values.numel() : 0, numel));
  if (values.numel() == 0)
    return {};
  try {
    torch::NoGradGuard guard;
    if (ef_ && (!residual_.defined() || residual_.numel() != numel))
      residual_ = torch::zeros({numel}, torch::kFloat);
    auto x = values.to(torch::kFloat).contiguous();
    if (ef_)
      x = x + residual_.narrow(0, offset, x.numel());
    kernels::codec_params p;
    p.ratio = ratio_;
    auto enc = kernels::encode(x, kernels::codec_id::topk, p);
    if (!enc)
      return fail("cannot re-sparsify a part: " + enc.error().what);
    auto kept = kernels::decode(*enc);
    if (!kept)
      return fail("cannot re-sparsify a part: " + kept.error().what);
    auto sparse = kept->to(torch::kFloat).reshape({-1});
    if (ef_)
      residual_.narrow(0, offset, x.numel()).copy_(x - sparse);
    values.copy_(sparse);
    return {};
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot re-sparsify a part: {}", e.what()));
  }
}

} // namespace starling::actors::averager
