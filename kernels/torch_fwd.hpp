// LibTorch as far as declarations need it: the tensor type (<ATen/core/Tensor.h>, ~1.4 s of a
// translation unit's compile instead of ~20 s for <torch/torch.h>), its `torch::` name, and the
// classes that headers only pass by reference or pointer. A header that needs no more than this
// includes it instead of <torch/torch.h>; the .cpp that calls LibTorch includes what it calls.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch {
using at::Tensor;
namespace optim {
class Optimizer;
} // namespace optim
} // namespace torch
