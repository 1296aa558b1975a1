#include "runtime/cli/cli.hpp"

#include <fmt/format.h>

namespace starling::runtime {

int cli_main(int argc, char** argv) {
  fmt::print("starling\n");
  return 0;
}

} // namespace starling::runtime
