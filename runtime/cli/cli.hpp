// Entry point of the `starling` executable, kept in the library so tests can call it.
#pragma once

#include <string>

#include <caf/fwd.hpp>

namespace starling::runtime {

/// The bare node's `ping` actor (`starling node`): answers `ping_msg{seq, origin}` with
/// `ping_msg{seq, name}`, and a ping whose envelope was refused with an error naming the reason.
caf::behavior ping_responder(caf::event_based_actor* self, std::string name);

/// Parses the command line, runs the chosen subcommand, returns the process exit code.
int cli_main(int argc, char** argv);

} // namespace starling::runtime
