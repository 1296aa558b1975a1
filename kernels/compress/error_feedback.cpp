#include "kernels/compress/codec.hpp"

#include <exception>
#include <string>

#include <ATen/ATen.h>

namespace starling::kernels {

error_feedback::error_feedback(codec_id codec, codec_params params)
  : codec_(codec), params_(params) {
  // Nothing else: the residual is shaped by the first input.
}

result<encoded_tensor> error_feedback::encode(const at::Tensor& x) {
  if (codec_ == codec_id::randk)
    return fail("error feedback needs a contractive codec; randk is unbiased, use it without EF");
  if (!x.defined())
    return fail("error feedback: undefined input");
  try {
    auto in = x.device().is_cpu() ? x : x.cpu();
    if (residual_.defined() && residual_.sizes() != in.sizes())
      return fail("error feedback: input shape changed between rounds (call reset first)");
    auto corrected = in.to(at::kFloat);
    if (residual_.defined())
      corrected = corrected + residual_;
    auto enc = kernels::encode(corrected, codec_, params_);
    if (!enc)
      return enc.error();
    auto sent = decode(*enc);
    if (!sent)
      return sent.error();
    residual_ = corrected - *sent;
    // Receivers restore the caller's dtype, not the fp32 used for accumulation.
    auto dt = to_wire_dtype(x.scalar_type());
    if (!dt)
      return dt.error();
    enc->header.dtype = *dt;
    return enc;
  } catch (const std::exception& e) {
    return fail(std::string{"error feedback failed: "} + e.what());
  }
}

void error_feedback::reset() {
  residual_ = at::Tensor{};
}

} // namespace starling::kernels
