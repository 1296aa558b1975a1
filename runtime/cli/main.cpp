// The `starling` command line.
#include "runtime/cli/cli.hpp"

int main(int argc, char** argv) {
  return starling::runtime::cli_main(argc, argv);
}
