// Precompiled header of the "tensor" group (cmake/starling.cmake): translation units whose
// includes reach <ATen/core/Tensor.h> and no heavier LibTorch header, plus CAF and fmt.
#pragma once
#include <ATen/core/Tensor.h>
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
