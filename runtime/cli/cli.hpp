// Entry point of the `starling` executable, kept in the library so tests can call it.
#pragma once

namespace starling::runtime {

/// Parses the command line, runs the chosen subcommand, returns the process exit code.
int cli_main(int argc, char** argv);

} // namespace starling::runtime
