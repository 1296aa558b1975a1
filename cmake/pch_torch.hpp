// Precompiled header of the "torch" group (cmake/starling.cmake): translation units whose
// includes reach LibTorch beyond <ATen/core/Tensor.h>; the heavy third-party includes.
#pragma once
#include <torch/torch.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>
