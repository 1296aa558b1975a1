// Serving the run's experiment to joiners (`starling join`), and fetching it. Every node of a
// cluster run registers an `experiment` actor in its directory (only admitted nodes reach it):
//   blob_msg{"experiment", {}}              -> blob_msg{"experiment", package bytes}
//       the experiment as the run started (runtime/experiment/package.hpp) with the node's gate's
//       verdict on the endpoint the asking node claimed in its hello (reachable or why not);
//   blob_msg{"experiment-file", 32-byte digest} -> blob_msg{"experiment-file", the file's bytes}
//       one file the experiment names, by digest (read again and checked against the digest: a
//       file changed since the start is refused, never served as another).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "kernels/result.hpp"
#include "runtime/experiment/package.hpp"

namespace starling::runtime {

class node;
class node_gate;

/// The name of the experiment server in a node's directory.
inline constexpr const char* experiment_server_name = "experiment";

/// The files an experiment's YAML text names: the scalars under the keys `files` (a list),
/// `path`, `eval_path` and `loss_file`, with their key paths (`dedloc.model.files[0]`); digests
/// and sizes unset. A file that does not parse is a failure naming the line.
result<std::vector<named_file>> scan_named_files(const std::string& yaml_text);

/// The package of experiment file `file` with `sets` and `nodes`: the file's bytes, every file it
/// names read from where it says (at most 64 MiB each), the digest, and the authority's signature
/// from `file + ".sig"` when that file exists and `with_signature` (a signature of another digest
/// or another node count is a failure that says to sign again).
result<experiment_package> make_package(const std::string& file,
                                        const std::vector<std::string>& sets, uint64_t nodes,
                                        bool with_signature = true);

/// Spawns the experiment server of `package` (see the file comment); `gate` gives the verdicts.
caf::actor spawn_experiment_server(caf::actor_system& sys, experiment_package package,
                                   std::shared_ptr<node_gate> gate);

/// What a joiner received, checked.
struct fetched_experiment {
  /// The package (digest checked; in a closed run, signature checked).
  experiment_package package;
  /// True when the signature was checked against the authority's key (a closed run); false
  /// for an open run's experiment, accepted unsigned (a signature it carries is not checked).
  bool signature_checked = false;
  /// The `--set` overrides that point each named file at its stored copy (`KEY=DIR/NAME`).
  std::vector<std::string> file_sets;
};

/// Fetches the experiment's package (not the files it names) from the node at `endpoint` through
/// `nd` (admission first: a refusal comes back as the failure's line) and checks its digest; the
/// signature is not checked. `server_out`, when given, receives the experiment server's handle.
result<experiment_package> fetch_package(node& nd, const std::string& endpoint,
                                         std::chrono::nanoseconds timeout,
                                         caf::actor* server_out = nullptr);

/// Fetches the experiment from the node at `endpoint` through `nd` (admission first: a refusal
/// comes back as the failure's line), checks its digest, and in a closed run (`authority_key`
/// not empty) its signature by that key over the digest and the node count it came with; then
/// fetches each named file by digest into `dir` (checked: size and digest). `timeout` bounds
/// each request. An empty `authority_key` is an open run's joiner (no authority, no token): the
/// experiment is accepted unsigned, as the node reached serves it (`signature_checked` false):
/// the caller trusts that node and must say so; a joiner that holds a token always passes its
/// authority's key, and an unsigned experiment is then refused.
result<fetched_experiment> fetch_experiment(node& nd, const std::string& endpoint,
                                            const std::string& authority_key,
                                            const std::string& dir,
                                            std::chrono::nanoseconds timeout);

} // namespace starling::runtime
