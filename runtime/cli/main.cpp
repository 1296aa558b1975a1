// The `starling` command line.
#include "runtime/cli/cli.hpp"
#include "runtime/experiment/allocator.hpp"

int main(int argc, char** argv) {
  starling::runtime::fix_mmap_threshold();
  return starling::runtime::cli_main(argc, argv);
}
