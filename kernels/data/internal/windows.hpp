// Stacking windows of seq_len + 1 tokens into (inputs, targets): shared by the text and token
// sources. Internal to kernels/data.
#pragma once

#include "kernels/data/data_source.hpp"

#include <torch/torch.h>

#include <fmt/format.h>

#include <cstdint>
#include <vector>

namespace starling::kernels::internal {

/// Windows of `seq_len` + 1 tokens starting at `stride`·id, each copied by
/// `copy(start, count, int64_t* out) -> status`; inputs are tokens [0, T), targets [1, T + 1).
/// Fails on an id not below `windows`, naming `what`.
template <class Copy>
result<sample_batch> stack_windows(const std::vector<uint64_t>& ids, uint64_t windows,
                                   int64_t seq_len, int64_t stride, const std::string& what,
                                   Copy&& copy) {
  const auto b = static_cast<int64_t>(ids.size());
  auto window = torch::empty({b, seq_len + 1}, torch::kLong);
  auto* w = window.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const uint64_t id = ids[static_cast<std::size_t>(i)];
    if (id >= windows)
      return fail(fmt::format("{}: sample {} requested, it has {} windows", what, id, windows));
    if (auto st = copy(id * static_cast<uint64_t>(stride), static_cast<uint64_t>(seq_len + 1),
                       w + i * (seq_len + 1));
        !st)
      return failure{st.what()};
  }
  return sample_batch{window.narrow(1, 0, seq_len).contiguous(),
                      window.narrow(1, 1, seq_len).contiguous()};
}

/// Number of windows of `seq_len` + 1 tokens at multiples of `stride` in `tokens` tokens.
inline uint64_t window_count(uint64_t tokens, int64_t seq_len, int64_t stride) {
  const auto need = static_cast<uint64_t>(seq_len + 1);
  return tokens < need ? 0 : (tokens - need) / static_cast<uint64_t>(stride) + 1;
}

} // namespace starling::kernels::internal
