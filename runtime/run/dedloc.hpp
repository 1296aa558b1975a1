// The `dedloc` kind: data-parallel peers (actors/dp_peer) training one model together — DeDLOC's
// collaborative optimizer or DiLoCo — with peers of different speeds, some in client mode, some
// auxiliary, joining and leaving on a seeded schedule. Its role type `dedloc.peer`, the
// schedule, and the reporter (accuracy and loss against samples and against bytes sent, as SVG,
// and a summary table) are public so that C++ graphs (examples/dedloc) use the same pieces.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/data/token_source.hpp"
#include "kernels/models/torchscript.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

/// Options of a `dedloc.peer` role (the `dedloc:` section's keys besides `peers`, `auxiliary`
/// and `churn`).
struct dedloc_role_options {
  /// `dedloc` (average gradients every global step) or `diloco` (inner steps, outer steps on
  /// averaged compressed pseudo-gradients).
  std::string algorithm = "dedloc";
  /// `torch` (an MLP on Fashion-MNIST) or `modeled` (the cost model: no tensors but a vector of
  /// `modeled_params` that averaging moves).
  std::string backend = "torch";
  /// `full`, `client` or `auxiliary`: the mode of every instance, except that the last
  /// `clients` of every `cycle` instances are clients.
  std::string mode = "full";
  /// Instance i is in client mode when `i mod cycle >= cycle - clients` (cycle 0: no clients).
  uint64_t clients = 0;
  uint64_t cycle = 0;
  /// Relative speeds; instance i computes at `speeds[i mod size]`.
  std::vector<double> speeds = {1.0};
  /// Seconds per microbatch at speed 1 (on CAF's clock: virtual in simulation).
  std::chrono::nanoseconds compute_time = std::chrono::milliseconds(50);
  /// Samples per microbatch.
  uint64_t microbatch = 32;
  /// Samples per global step, summed over the collaboration.
  uint64_t target_batch = 1024;
  /// MLP hidden width and hidden blocks (inputs 784, 10 classes).
  int64_t width = 128;
  int64_t layers = 1;
  /// A TorchScript model trained whole instead of the MLP (`model: {kind: torchscript, files:
  /// [...], ...}`; every peer loads the same files, so all start equal).
  std::optional<kernels::torchscript_config> torchscript;
  /// What the peers read: `idx` (Fashion-MNIST from `data_dir`) or `tokens` (a token file, with
  /// a held-out token file for the evaluation; windows of the model's seq_len).
  std::string data_kind = "idx";
  std::string tokens_path;
  std::string tokens_eval_path;
  kernels::token_dtype tokens_dtype = kernels::token_dtype::uint16;
  /// The collaboration's optimizer (DiLoCo: the inner one): `adam`, `lamb` or `sgd`, its
  /// learning rate, SGD momentum and the global-norm clip of each step.
  std::string optimizer = "adam";
  double lr = 1e-3;
  double momentum = 0.0;
  double max_grad_norm = 1.0;
  /// Held-out evaluation every this many global steps (0: never) on this many test images.
  uint64_t eval_every = 5;
  uint64_t eval_samples = 2000;
  /// Fashion-MNIST folder; `synthetic`: a generated stand-in when the files are absent.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool synthetic = false;
  /// Training images used (0: all 60000).
  uint64_t train_samples = 0;
  /// Cost model: elements of the modeled parameter vector.
  int64_t modeled_params = 100'000;
  /// Averaging: matchmaking window, the averager's round deadline, chunk codec, largest group.
  std::chrono::nanoseconds window = std::chrono::seconds(2);
  std::chrono::nanoseconds averager_timeout = std::chrono::seconds(15);
  std::string codec = "none";
  uint64_t group_size = 64;
  /// Collaborative optimizer: a round not finished this long after it started is given up;
  /// parameters and optimizer state are averaged every this many steps (0: never).
  std::chrono::nanoseconds round_timeout = std::chrono::seconds(30);
  uint64_t average_state_every = 0;
  /// After a peer stepped on its own gradient (a failed round), average parameters and optimizer
  /// state with the peers after its next update (the coordinator's `resync_after_lone_step`).
  bool resync_after_lone_step = true;
  /// That resync downloads the state of the peers at its step that took the averaged update
  /// when they are the most (else it is a state round, as it always is without this).
  bool resync_by_download = true;
  /// Gradient rounds re-form the last step's group at once while its members stay (the
  /// averager's `family_groups`): no matchmaking window per step. Off: every step's group is
  /// formed anew in a matchmaking window.
  bool persistent_rounds = true;
  /// Delayed parameter updates (DeDLOC only): peers keep computing while a step's gradient is
  /// averaged and apply the averaged gradient when it arrives, so step t + 1's first gradients
  /// come from parameters one step old. Off: a peer pauses for every round.
  bool delay_updates = false;
  /// Progress records expire this long after they were made (a silent leaver stops counting).
  std::chrono::nanoseconds record_lifetime = std::chrono::seconds(30);
  /// DiLoCo: samples per inner step, the outer optimizer (SGD), pseudo-gradient codec.
  uint64_t inner_batch = 128;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool outer_nesterov = true;
  std::string outer_codec = "topk";
  double outer_ratio = 0.005;
  bool error_feedback = true;
};

/// Reads a `dedloc.peer` options map (strictly) into `o`.
void read_dedloc_role(config_node& n, dedloc_role_options& o);

/// Checks the options (known algorithm, backend, mode and codecs; positive sizes).
status check_dedloc_role(const dedloc_role_options& o);

/// A seeded churn schedule for `role` (initially `replicas` instances): on average `per_minute`
/// of the live instances leave per minute (a Poisson process), each replaced by a newcomer
/// `rejoin_after` later; at least `keep` stay, and, when `serves` is given, at least one live
/// instance `i` with `serves(i)` (a full-mode peer: newcomers download the state from it;
/// without one they start the model anew). Appends join and leave events to `g` (which must
/// hold the role) for the run's duration.
void add_churn(experiment_graph& g, const std::string& role, size_t replicas, double per_minute,
               uint64_t seed, std::chrono::nanoseconds rejoin_after = std::chrono::seconds(5),
               size_t keep = 2, const std::function<bool(size_t)>& serves = {});

/// What a collaboration's reporter exports at the end (`dedloc.export: true`).
struct dedloc_export_options {
  /// The role whose final model is exported, and its options (the model, data and evaluation).
  std::string role = "peers";
  dedloc_role_options peer;
};

/// Checks that `o` can be exported: the torch backend (the cost model has no parameters).
status check_dedloc_export(const dedloc_role_options& o);

/// The reporter of a collaboration: progress lines; at the end a summary table and, into the
/// run's folder, accuracy.svg and loss.svg (against samples) and accuracy_bytes.svg and
/// loss_bytes.svg (against megabytes sent per peer). With `export_model`, it also writes the
/// final model (the state of the live full-mode peer of `role` with the most global steps) into
/// `<out>/export`: TorchScript files and state dicts (`kernels::export_stage`) and `export.json`
/// with the held-out loss of that state. Exit code 1 when no global step was taken.
std::unique_ptr<reporter>
make_dedloc_reporter(std::optional<dedloc_export_options> export_model = std::nullopt);

} // namespace starling::runtime
