// The `model: {kind: torchscript, ...}` section shared by the experiment kinds that train a
// scripted PyTorch model (swarm, dedloc): read strictly, then loaded and checked once
// (kernels/models/torchscript.hpp), so a bad file is a config error naming the key's line.
#pragma once

#include "kernels/models/torchscript.hpp"

#include <string>
#include <vector>

namespace starling::runtime {
class config_node;
} // namespace starling::runtime

namespace starling::runtime::graph {

/// Every key of a TorchScript model section, `kind` included (for `config_node::allow`).
std::vector<std::string> torchscript_keys();

/// Reads `files` (a list, in pipeline order; paths relative to the working directory), `vocab`,
/// `seq_len`, `input_shape` (omitted: token input), `loss` (cross_entropy | mse | scripted) and
/// `loss_file` from `m`, then loads every file and runs the checks of `inspect_torchscript`; any
/// failure is a config error at `m`. Does not call `m.finish()`.
kernels::torchscript_config read_torchscript_model(config_node& m);

} // namespace starling::runtime::graph
