// Precompiled header: the heavy third-party includes every starling target uses.
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
