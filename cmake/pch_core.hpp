// Precompiled header of the "core" group (cmake/starling.cmake): translation units that include
// no LibTorch header at all; CAF and fmt are their heavy includes.
#pragma once
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
