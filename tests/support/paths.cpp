// The build's paths, compiled here once (see paths.hpp).
#include "support/paths.hpp"

namespace starling::testing {

const std::string& starling_binary() {
  static const std::string p{STARLING_BINARY_PATH};
  return p;
}

const std::string& build_dir() {
  static const std::string p{STARLING_BUILD_PATH};
  return p;
}

const std::string& source_dir() {
  static const std::string p{STARLING_SOURCE_PATH};
  return p;
}

} // namespace starling::testing
