// The version `starling --version` and the run's metadata print.
#pragma once

namespace starling::runtime {

/// This build's version (CMakeLists.txt's project version).
inline constexpr const char* starling_version = "0.1.0";

} // namespace starling::runtime
