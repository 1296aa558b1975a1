// The sections shared by the experiment kinds that train a model (swarm, dedloc): `model: {kind:
// torchscript, ...}`, read strictly, then loaded and checked once (kernels/models/torchscript.hpp),
// so a bad file is a config error naming the key's line; and `data:`, read into the data-source
// registry's options (kernels/data/source_registry.hpp), one schema for every kind.
#pragma once

#include "kernels/data/source_registry.hpp"
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

/// Reads a `data:` section into `out`: `kind` (one of `kinds`); for tokens `path` (required),
/// `eval_path` (the held-out file) and `dtype`; for text and tokens `stride`. A key of another
/// kind fails naming the kind it belongs to. `extra` are keys the caller reads itself (allowed
/// here); does not call `d.finish()`.
void read_data_section(config_node& d, kernels::data_source_options& out,
                       const std::vector<std::string>& kinds,
                       const std::vector<std::string>& extra = {});

} // namespace starling::runtime::graph
