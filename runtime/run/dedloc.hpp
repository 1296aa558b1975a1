// The `dedloc` kind: data-parallel peers (actors/dp_peer) training one model together — DeDLOC's
// collaborative optimizer or DiLoCo — with peers of different speeds, some in client mode, some
// auxiliary, joining and leaving on a seeded schedule (`churn:`, the plan's churn_spec). Its role
// type `dedloc.peer` and the reporter (accuracy and loss against samples and against bytes sent,
// as SVG, and a summary table) are public so that C++ graphs (examples/dedloc) use the same
// pieces.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/averager/averager.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/dp_peer/dp_peer.hpp"
#include "kernels/data/source_registry.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/torchscript.hpp"
#include "kernels/t2i/demo.hpp"
#include "kernels/t2i/t2i_source.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

/// Options of a `dedloc.peer` role: the options structs of the components an instance is made
/// of, which the `dedloc:` section's keys (besides `peers`, `auxiliary`, `churn`, `steps` and
/// `export`) are read into directly (configs/reference.yaml documents each key), plus
/// the few that pick a component or vary by instance. What only an instance knows (its address,
/// name, stream, its averager's bandwidth) is set when it is spawned.
struct dedloc_role_options {
  /// The kind's defaults where they differ from the components' own.
  dedloc_role_options();

  /// `torch` (a LibTorch model on the data) or `modeled` (the cost model: no tensors but a
  /// vector of `modeled.numel` elements that averaging moves).
  std::string backend = "torch";
  /// Instance i is in client mode when `i mod cycle >= cycle - clients` (cycle 0: no clients);
  /// the others are in `peer.collab.mode`.
  uint64_t clients = 0;
  uint64_t cycle = 0;
  /// LibTorch's intra-op threads in a process of peers (`torch_threads`; 0: LibTorch's default).
  /// Peers compute on the actor threads already: with several per process, more intra-op threads
  /// only oversubscribe the cores.
  int64_t torch_threads = 0;
  /// Added to an instance's index where its data order is drawn (volunteers draw after peers).
  uint64_t seed_offset = 0;
  /// The role whose collaboration (progress records, state donors) the instances join; empty:
  /// their own role's (volunteers join the peers').
  std::string collaboration;
  /// Relative speeds; instance i computes at `speeds[i mod size]` (`peer.speed`).
  std::vector<double> speeds = {1.0};
  /// The peer: the algorithm (`algo`), the collaborative optimizer's decisions (`collab`:
  /// mode, target batch, record lifetime, round timeout, resyncs, delayed updates), DiLoCo's
  /// inner batch and outer step (`diloco`), `compute_time` and `eval_every`.
  actors::dp_peer::dp_peer_options peer;
  /// DeDLOC's averager: largest group, matchmaking window, round deadline, chunk codec,
  /// persistent rounds (`family_groups`).
  actors::averager::averager_options averager;
  /// The LibTorch backend: the MLP's width and hidden blocks (its input and class counts come
  /// from the data), the optimizer, the microbatch (`stream.microbatch`, both backends') and the
  /// held-out samples of an evaluation.
  actors::dp_peer::torch_backend_options torch;
  /// A TorchScript model trained whole instead of the MLP (`model: {kind: torchscript, files:
  /// [...], ...}`; every peer loads the same files, so all start equal).
  std::optional<kernels::torchscript_config> torchscript;
  /// The built-in GPT of the text-to-image demo (`model: {kind: gpt, ...}`), trained whole on
  /// `t2i`'s sequences; its vocabulary and sequence length come from `t2i_layout_of(*t2i)`.
  std::optional<kernels::gpt_config> gpt;
  /// The demo's data, set with `gpt`: Fashion-MNIST as [caption | separator | image tokens], the
  /// codebook fit by every process from the same images and seed (`model.codebook_*`).
  std::optional<kernels::t2i_data_options> t2i;
  /// What the end of a demo run writes (`dedloc.demo`): grid.png and quality.json.
  kernels::t2i_demo_options demo;
  /// The cost model's parameter vector.
  actors::dp_peer::modeled_backend_options modeled;
  /// What the peers read, from the data-source registry: `idx` (Fashion-MNIST from `idx.dir`,
  /// or its synthetic stand-in; held out: its test split) or `tokens` (a token file, windows of
  /// the model's seq_len; held out: `eval_path`).
  kernels::data_source_options data;
};

/// Reads a `dedloc.peer` options map (strictly) into `o`: each key into its component's field.
void read_dedloc_role(config_node& n, dedloc_role_options& o);

/// Checks what the reader cannot check key by key: positive sizes and durations, a target batch
/// of at least one microbatch, options that belong together (clients and cycle, delayed updates
/// and DeDLOC, a model and its data).
status check_dedloc_role(const dedloc_role_options& o);

/// Checks a model against the data it reads (`data`: the training source's shape): a
/// TorchScript model of images takes as many features as a sample holds and has at least the
/// data's classes. (The MLP takes its input and class counts from the data.)
status check_dedloc_data(const dedloc_role_options& o, const kernels::sample_shape& data);

/// What a collaboration's reporter exports at the end (`dedloc.export: true`).
struct dedloc_export_options {
  /// The role whose final model is exported, and its options (the model, data and evaluation).
  std::string role = "peers";
  dedloc_role_options peer;
};

/// The token layout of the demo's data (K codes, (28 / patch)² tokens per image).
kernels::t2i_layout t2i_layout_of(const kernels::t2i_data_options& t);

/// Checks that `o` can be exported: the torch backend (the cost model has no parameters).
status check_dedloc_export(const dedloc_role_options& o);

/// The reporter of a collaboration: progress lines; at the end a summary table and, into the
/// run's folder, accuracy.svg and loss.svg (against samples) and accuracy_bytes.svg and
/// loss_bytes.svg (against megabytes sent per peer). With `export_model`, it also writes the
/// final model (the state of the live full-mode peer of `role` with the most global steps) into
/// `<out>/export`: TorchScript files and state dicts (`kernels::export_stage`) and `export.json`
/// with the held-out loss of that state. With `demo` (a text-to-image run, `model.kind: gpt`), it
/// also writes grid.png and quality.json into `<out>` from that final state
/// (`kernels::write_t2i_demo`). Exit code 1 when no global step was taken.
std::unique_ptr<reporter>
make_dedloc_reporter(std::optional<dedloc_export_options> export_model = std::nullopt,
                     std::optional<dedloc_export_options> demo = std::nullopt);

} // namespace starling::runtime
