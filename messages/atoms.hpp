// Atoms shared by starling actors (at most 10 characters each, CAF 0.17).
#pragma once

#include <caf/atom.hpp>

namespace starling {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using put_atom = caf::atom_constant<caf::atom("put")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using resolve_atom = caf::atom_constant<caf::atom("resolve")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using metric_atom = caf::atom_constant<caf::atom("metric")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using transfer_atom = caf::atom_constant<caf::atom("transfer")>;

} // namespace starling
