// A lossless wire form of codec payloads for pseudo-gradients (DiLoCo): Top-k's strictly
// increasing indices travel as LEB128 varints of their gaps instead of 4-byte integers. At 0.5%
// density the mean gap is ~200, so an index takes ~1.5 bytes instead of 4, and an entry ~5.5
// bytes instead of 8: what lets Top-k 0.5% move more than 100× fewer bytes than fp32 (the raw
// codec layout gives exactly 100× at best). Other codecs' payloads pass unchanged. No torch.
//
// Packed Top-k layout: k varints (gap_i = index_i − index_{i−1} − 1, index_{−1} = −1), then the
// codec's k fp32 values as they are. k and numel come from the (validated) header.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"

namespace starling::actors::collab {

/// Packs a codec payload that passes `kernels::check_payload` for `header`; fails otherwise.
result<std::vector<uint8_t>> pack_payload(const kernels::tensor_header& header,
                                          const uint8_t* payload, size_t size);

/// Unpacks untrusted bytes into the codec's payload layout for `header`: fails, never throws,
/// on an invalid header, a truncated or overlong varint, an index past numel, or a size that
/// does not match; what it returns passes `kernels::check_payload`.
result<std::vector<uint8_t>> unpack_payload(const kernels::tensor_header& header,
                                            const uint8_t* data, size_t size);

} // namespace starling::actors::collab
