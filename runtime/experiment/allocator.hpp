// The process's allocator settings for training: glibc's malloc raises its mmap threshold to the
// size of the first large block it frees (up to 32 MiB), after which every tensor of a few MiB
// comes from the heap arenas instead of its own mapping. With many actors allocating and freeing
// such tensors on several threads (gradients, averaging parts, state vectors), the arenas then
// fragment and keep the memory: `configs/dedloc64.yaml --sim` for 10 s peaked at 4.7 GB with the
// moving threshold and 1.0 GB with a fixed one, same trace digest (docs/results.md). Fixing the
// threshold keeps blocks of 1 MiB and more in their own mappings, returned to the system on free.
#pragma once

#include <cstddef>
#include <cstdlib>

#include <malloc.h>

namespace starling::runtime {

/// Fixes glibc's mmap threshold at `bytes` (which also stops its moving), unless the user set
/// `MALLOC_MMAP_THRESHOLD_` in the environment. Call once, early in `main`.
inline void fix_mmap_threshold(size_t bytes = size_t{1} << 20) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr)
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
}

} // namespace starling::runtime
