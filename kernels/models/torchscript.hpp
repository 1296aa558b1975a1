// Models written in PyTorch and scripted (`torch.jit.script(m).save(f)`): a pipeline of TorchScript
// files, one per block, trained by starling like the built-in models. Registered as
// "torchscript" (options `torchscript_config`). Loading checks what a stage relies on: every file
// loads, maps one tensor to one tensor, is deterministic once seeded (stages recompute their
// forward in backward), accepts the previous file's output, takes every token id of the
// vocabulary, and the last file's output fits the loss. Every error names the file and the
// mismatch.
//
// Dropout: TorchScript's dropout draws from LibTorch's default CPU generator (one per process;
// `torch.Generator` cannot be scripted). Every scripted forward therefore runs under one
// process-wide lock, with that generator seeded from the layer's seed (public values: the
// microbatch's seed and the layer's place) and its state put back afterwards, so a recomputed
// forward draws the masks of the original one. Scripted forwards in one process are serialized.
// Buffers (batch norm's running statistics) are the stage's buffers (`named_buffers`), the
// scripted module's own tensors.
// LibTorch's JIT headers stay in torchscript.cpp.
#pragma once

#include "kernels/models/registry.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/result.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace starling::kernels {

/// The loss of a scripted model's last stage.
enum class loss_kind : uint8_t {
  /// Mean cross-entropy of logits [..., C] against int64 class ids [...] (next tokens).
  cross_entropy,
  /// Mean squared error of the output against float targets of its shape, or against the one-hot
  /// encoding of int64 class ids [...] for an output [..., C].
  mse,
  /// A scripted module `forward(output, targets) -> Tensor` (a scalar) from `loss_file`, given
  /// the int64 targets the data gives.
  scripted,
};

/// "cross_entropy", "mse" or "scripted".
const char* to_string(loss_kind k) noexcept;

/// A pipeline of TorchScript files.
struct torchscript_config {
  /// The files in pipeline order; file i is block i (the unit stages are cut by). Each scripted
  /// module's `forward` takes one tensor (or a tensor and an int: the microbatch's dropout seed)
  /// and returns one tensor. File 0 takes the model's input, the last returns the loss's input.
  std::vector<std::string> files;
  /// Vocabulary (or class count): token ids and targets lie in [0, vocab); the last file's output
  /// has `vocab` features for the cross-entropy and MSE losses.
  int64_t vocab = 256;
  /// Tokens per sample of a token model (the input is int64 [B, seq_len]).
  int64_t seq_len = 128;
  /// Feature sizes of one float sample ([1, 28, 28]); empty: the input is tokens.
  std::vector<int64_t> input_shape;
  /// The loss, and its file when `loss == loss_kind::scripted`.
  loss_kind loss = loss_kind::cross_entropy;
  std::string loss_file;
};

/// What loading found: the tensor entering each file and the last file's output (batch 2).
struct torchscript_layout {
  /// `inputs[i]`: the tensor file i takes.
  std::vector<tensor_shape> inputs;
  /// What the last file returns.
  tensor_shape output;
  /// Parameters of every file together.
  int64_t parameters = 0;
};

/// Checks a config without opening files (at least one file, positive sizes, a loss file iff the
/// loss is scripted).
status validate(const torchscript_config& cfg);

/// Loads every file (and the loss file) and runs the checks of the header comment on a probe
/// batch of 2 samples: the layout, or one error naming the file and the mismatch.
result<torchscript_layout> inspect_torchscript(const torchscript_config& cfg);

/// The stage holding files [begin, end): loads those files, checks each for determinism on the
/// probe input of `inspect_torchscript`, and checks untrusted input (dtype, sizes but the batch
/// dimension, token ids) before computing.
result<std::shared_ptr<stage_module>> make_torchscript_stage(const torchscript_config& cfg,
                                                             int64_t begin, int64_t end);

/// The spec of the scripted model `cfg`.
model_spec torchscript_model(const torchscript_config& cfg);

/// The registry entry of "torchscript" (part of `model_registry::builtins()`).
model_entry torchscript_entry();

/// The named tensors of one module as Python's `state_dict()` lists them.
using named_tensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes `tensors` as a dict of name to tensor with `torch::pickle_save`, a file Python's
/// `torch.load` reads; fails naming the path when it cannot be written.
status save_state_dict(const named_tensors& tensors, const std::string& path);

/// Reads a file written by `save_state_dict` (or Python's `torch.save` of a state_dict).
result<named_tensors> load_state_dict(const std::string& path);

/// What `export_stage` wrote.
struct exported_files {
  /// TorchScript files with the stage's current parameters (scripted stages only).
  std::vector<std::string> torchscript;
  /// State dicts: one per scripted file (its own parameter names), or one for a built-in stage
  /// (the whole model's names, `block<i>.*`).
  std::vector<std::string> state_dicts;
};

/// Saves the stage's current parameters into `dir` (created if missing): each scripted file as
/// `<stem>.pt` (TorchScript) and `<stem>.state_dict.pt`; a built-in stage as
/// `stage<index>.state_dict.pt`.
result<exported_files> export_stage(stage_module& stage, int64_t index, const std::string& dir);

} // namespace starling::kernels
