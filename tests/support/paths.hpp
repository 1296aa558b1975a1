// Where the tested build lives, read at run time: the `starling` binary, the build folder and
// the source tree. The paths are compiled into one support object (tests/support/paths.cpp),
// not into every test file, so a test file compiles to the same object in every checkout and
// ccache (CCACHE_BASEDIR) hits across clones and worktrees.
#pragma once

#include <string>

namespace starling::testing {

/// The `starling` command of this build (absolute path).
const std::string& starling_binary();

/// The build folder (CMAKE_BINARY_DIR).
const std::string& build_dir();

/// The source tree's root (CMAKE_SOURCE_DIR).
const std::string& source_dir();

} // namespace starling::testing

/// As the old compile-time definitions, now std::string values: `STARLING_SOURCE_DIR + "/x"`.
#define STARLING_BINARY (::starling::testing::starling_binary())
#define STARLING_BUILD_DIR (::starling::testing::build_dir())
#define STARLING_SOURCE_DIR (::starling::testing::source_dir())
