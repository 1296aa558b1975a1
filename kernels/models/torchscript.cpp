#include "kernels/models/torchscript.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/script.h>
#include <torch/serialize.h>

namespace starling::kernels {

namespace {

namespace fs = std::filesystem;

/// Samples of the probe batch every file is checked with.
constexpr int64_t probe_batch = 2;

/// The seed the probe passes to modules that take one.
constexpr int64_t probe_seed = 1234;

/// The useful line of a LibTorch error: TorchScript errors carry the interpreter's traceback
/// before the Python-style "RuntimeError: ..." line.
std::string short_error(const std::exception& e) {
  auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  for (auto marker : {"RuntimeError: ", "IndexError: ", "ValueError: ", "TypeError: "}) {
    auto at = text.rfind(marker);
    if (at != std::string::npos) {
      text = text.substr(at);
      break;
    }
  }
  auto nl = text.find('\n');
  if (nl != std::string::npos)
    text.resize(nl);
  return text;
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), c10::str(t.sizes()));
}

tensor_shape shape_of(const torch::Tensor& t) {
  return tensor_shape{t.sizes().vec(), t.scalar_type()};
}

/// A loaded scripted module and how its forward is called.
struct script {
  std::string file;
  torch::jit::Module module;
  /// Forward takes (Tensor, int seed) rather than (Tensor).
  bool takes_seed = false;
};

/// Loads `path`: one error each for a missing file, a file that is not TorchScript, and a forward
/// of another signature than (Tensor[, int]) or, for a loss, (Tensor, Tensor).
result<script> load_script(const std::string& path, bool is_loss) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return fail(fmt::format("{}: no such file", path));
  if (!fs::is_regular_file(path, ec))
    return fail(fmt::format("{}: not a regular file", path));
  script s;
  s.file = path;
  try {
    s.module = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    return fail(fmt::format("{}: not a loadable TorchScript file ({})", path, short_error(e)));
  }
  auto method = s.module.find_method("forward");
  if (!method)
    return fail(fmt::format("{}: the scripted module has no forward method", path));
  auto& args = method->function().getSchema().arguments();
  auto is = [&](size_t i, const c10::TypePtr& t) {
    return i < args.size() && args[i].type()->isSubtypeOf(*t);
  };
  auto tensor = c10::TensorType::get();
  bool ok = false;
  if (is_loss) {
    ok = args.size() == 3 && is(1, tensor) && is(2, tensor);
  } else {
    ok = (args.size() == 2 && is(1, tensor))
         || (args.size() == 3 && is(1, tensor) && is(2, c10::IntType::get()));
    s.takes_seed = args.size() == 3;
  }
  if (!ok)
    return fail(fmt::format("{}: forward must take {}, not {}", path,
                            is_loss ? "(output: Tensor, targets: Tensor)"
                                    : "(x: Tensor) or (x: Tensor, seed: int)",
                            c10::toString(method->function().getSchema())));
  return s;
}

/// The lock every scripted forward of the process runs under. TorchScript's dropout (and any
/// `torch.rand*` in a scripted forward) draws from LibTorch's default CPU generator, one per
/// process, and `torch.Generator` cannot be scripted: so a forward seeds that generator from
/// public values and runs alone, and its recomputation, seeded alike, draws the same masks.
/// The price: scripted forwards in one process are serialized.
std::mutex& scripted_forward_lock() {
  static std::mutex m;
  return m;
}

/// Calls a layer's forward with LibTorch's default CPU generator seeded with `seed` (and `seed`
/// as the second argument when forward takes one), under `scripted_forward_lock`; the
/// generator's state is put back afterwards, so no other user of it notices. Throws a c10::Error
/// when forward returns anything but one tensor.
torch::Tensor call(script& s, const torch::Tensor& x, int64_t seed) {
  std::lock_guard<std::mutex> lock{scripted_forward_lock()};
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> g{gen.mutex()};
    saved = gen.get_state();
    gen.set_current_seed(static_cast<uint64_t>(seed));
  }
  struct restore {
    at::Generator& gen;
    const torch::Tensor& state;
    ~restore() {
      std::lock_guard<std::mutex> g{gen.mutex()};
      gen.set_state(state);
    }
  } restore_on_exit{gen, saved};
  auto out = s.takes_seed ? s.module.forward({x, seed}) : s.module.forward({x});
  TORCH_CHECK(out.isTensor(), "forward returned ", out.tagKind(), ", not one tensor");
  return out.toTensor();
}

/// Copies of a scripted module's buffers, to put back what a training-mode forward changed
/// (batch norm's running statistics).
std::vector<torch::Tensor> save_buffers(const torch::jit::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& b : m.buffers(true))
    out.push_back(b.clone());
  return out;
}

void restore_buffers(const torch::jit::Module& m, const std::vector<torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const auto& b : m.buffers(true))
    b.copy_(saved.at(i++));
}

/// Runs `s` twice on `x` in training mode without autograd, as a stage runs a forward and then
/// recomputes it (both seeded alike, the second seeing the buffers the first left), compares,
/// and puts back the buffers it found. Dropout passes; a forward that depends on anything else
/// that changes between calls does not.
result<torch::Tensor> deterministic_forward(script& s, const torch::Tensor& x,
                                            const std::string& input_note) {
  torch::NoGradGuard no_grad;
  s.module.train(true);
  auto found = save_buffers(s.module);
  torch::Tensor a, b;
  try {
    a = call(s, x, probe_seed);
    b = call(s, x, probe_seed);
    restore_buffers(s.module, found);
  } catch (const std::exception& e) {
    restore_buffers(s.module, found);
    return fail(fmt::format("{}: does not accept {} ({}): {}", s.file, input_note, describe(x),
                            short_error(e)));
  }
  auto diff = a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type()
                ? (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>()
                : std::numeric_limits<double>::infinity();
  auto scale = std::max(1.0, a.to(torch::kDouble).abs().max().item<double>());
  if (!(diff <= 1e-6 * scale))
    return fail(fmt::format("{}: not deterministic: two forward passes on the same input differ "
                            "by up to {:.3g} although both were seeded alike (a stage recomputes "
                            "its forward in backward; dropout and torch.rand* are seeded, but the "
                            "output must not depend on state a forward changes)",
                            s.file, diff));
  return a;
}

/// The probe input of the model: tokens covering the whole vocabulary's range (the last one is
/// vocab - 1), or seeded normal features.
torch::Tensor probe_input(const torchscript_config& cfg, int64_t batch) {
  if (cfg.input_shape.empty()) {
    auto t = (torch::arange(batch * cfg.seq_len, torch::kLong) * 7 + 3).remainder(cfg.vocab);
    t[-1] = cfg.vocab - 1;
    return t.reshape({batch, cfg.seq_len});
  }
  std::vector<int64_t> sizes{batch};
  sizes.insert(sizes.end(), cfg.input_shape.begin(), cfg.input_shape.end());
  auto gen = seeded_generator(17);
  return torch::randn(sizes, gen, torch::kFloat);
}

/// The shape of the targets for `batch` samples: int64 ids per token, or one label per sample.
std::vector<int64_t> target_sizes(const torchscript_config& cfg, int64_t batch) {
  if (cfg.input_shape.empty())
    return {batch, cfg.seq_len};
  return {batch};
}

torch::Tensor probe_targets(const torchscript_config& cfg) {
  auto sizes = target_sizes(cfg, probe_batch);
  auto n = c10::multiply_integers(sizes);
  return (torch::arange(n, torch::kLong) * 5 + 1).remainder(cfg.vocab).reshape(sizes);
}

std::string input_note(const torchscript_config& cfg) {
  if (cfg.input_shape.empty())
    return fmt::format("the model's input, tokens with ids up to {} (vocab {})", cfg.vocab - 1,
                       cfg.vocab);
  return "the model's input";
}

/// The loss of `output` against `targets` for the built-in kinds.
torch::Tensor builtin_loss(loss_kind kind, const torch::Tensor& output,
                           const torch::Tensor& targets) {
  if (kind == loss_kind::cross_entropy)
    return mean_cross_entropy(output, targets);
  auto t = targets;
  if (!t.is_floating_point())
    t = torch::one_hot(t, output.size(-1)).to(output.scalar_type());
  TORCH_CHECK(t.sizes() == output.sizes(), "MSE targets ", c10::str(t.sizes()),
              " do not match the output ", c10::str(output.sizes()));
  return torch::mse_loss(output, t);
}

/// Checks the last file's output against what the loss needs.
status check_output(const torchscript_config& cfg, const std::string& file,
                    const torch::Tensor& out) {
  if (cfg.loss == loss_kind::scripted)
    return {};
  auto want = target_sizes(cfg, probe_batch);
  want.push_back(cfg.vocab);
  if (!out.is_floating_point() || out.sizes().vec() != want)
    return fail(fmt::format("{}: returns {}; the {} loss needs float {} (vocab {})", file,
                            describe(out), to_string(cfg.loss),
                            c10::str(c10::IntArrayRef(want)), cfg.vocab));
  return {};
}

/// Checks the scripted loss on the probe output: a deterministic scalar.
status check_loss_script(script& loss, const torchscript_config& cfg, const torch::Tensor& out) {
  torch::NoGradGuard no_grad;
  auto targets = probe_targets(cfg);
  torch::Tensor a, b;
  try {
    a = loss.module.forward({out, targets}).toTensor();
    b = loss.module.forward({out, targets}).toTensor();
  } catch (const std::exception& e) {
    return fail(fmt::format("{}: does not accept the model's output ({}) and targets ({}): {}",
                            loss.file, describe(out), describe(targets), short_error(e)));
  }
  if (a.numel() != 1 || !a.is_floating_point())
    return fail(fmt::format("{}: returns {}; a loss must be one floating-point number", loss.file,
                            describe(a)));
  if (!a.equal(b))
    return fail(fmt::format("{}: not deterministic: two passes give {} and {}", loss.file,
                            a.item<double>(), b.item<double>()));
  return {};
}

// -- stage layers -------------------------------------------------------------------------------

/// A holder of mirrored parameters, so that a stage's parameter names are the scripted module's.
class param_node : public torch::nn::Module {};

/// One scripted file as a stage layer. Its parameters and buffers are the scripted module's own
/// tensors (registered again here under the same dotted path), so gradients, optimizer steps,
/// state downloads and averaging reach the module through the stage's parameter and buffer
/// lists (a training-mode forward updates running statistics in place: the mirrors see it).
class scripted_layer : public stage_layer {
public:
  scripted_layer(script s, tensor_shape input) : s_(std::move(s)), input_(std::move(input)) {
    for (const auto& p : s_.module.named_parameters(true))
      mirror(p.name, p.value, false);
    for (const auto& b : s_.module.named_buffers(true))
      mirror(b.name, b.value, true);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    return call(s_, x, static_cast<int64_t>(seed_ & 0x7fffffffffffffffull));
  }

  status check_input(const torch::Tensor& x) const override {
    auto sizes = x.sizes().vec();
    auto ok = x.scalar_type() == input_.dtype && sizes.size() == input_.sizes.size()
              && !sizes.empty() && sizes[0] >= 1
              && std::equal(sizes.begin() + 1, sizes.end(), input_.sizes.begin() + 1);
    if (!ok) {
      auto want = input_.sizes;
      return fail(fmt::format("{}: expects {} [B, {}], got {}", s_.file,
                              c10::toString(input_.dtype),
                              fmt::join(want.begin() + 1, want.end(), ", "), describe(x)));
    }
    return {};
  }

  void reseed_dropout(uint64_t seed) override { seed_ = seed; }

  void train(bool on) override {
    stage_layer::train(on);
    s_.module.train(on);
  }

  /// The scripted module (holding the current parameters).
  torch::jit::Module& module() { return s_.module; }

  /// The file it was loaded from.
  const std::string& file() const { return s_.file; }

private:
  void mirror(const std::string& name, const torch::Tensor& t, bool buffer) {
    torch::nn::Module* node = this;
    std::string rest = name;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      auto part = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
      auto* child = node->named_children().find(part);
      node = child ? child->get() : node->register_module(part, std::make_shared<param_node>()).get();
    }
    if (buffer)
      node->register_buffer(rest, t);
    else
      node->register_parameter(rest, t, t.requires_grad());
  }

  script s_;
  tensor_shape input_;
  uint64_t seed_ = 0;
};

/// The first stage's input layer: checks tokens against the vocabulary (or features against
/// their shape) and passes them on; no parameters.
class model_input : public stage_layer {
public:
  explicit model_input(torchscript_config cfg) : cfg_(std::move(cfg)) {}

  /// Tokens pass; features come as [B, input_shape...] or flat [B, numel of input_shape] (image
  /// data sources give flat rows) and leave as [B, input_shape...].
  torch::Tensor forward(const torch::Tensor& x) override {
    if (cfg_.input_shape.empty() || x.dim() != 2 || cfg_.input_shape.size() == 1)
      return x;
    std::vector<int64_t> want{x.size(0)};
    want.insert(want.end(), cfg_.input_shape.begin(), cfg_.input_shape.end());
    return x.reshape(want);
  }

  status check_input(const torch::Tensor& x) const override {
    if (cfg_.input_shape.empty()) {
      if (x.scalar_type() != torch::kLong || x.dim() != 2 || x.size(1) != cfg_.seq_len
          || x.size(0) < 1)
        return fail(fmt::format("{}: expects int64 tokens [B, {}], got {}", cfg_.files.front(),
                                cfg_.seq_len, describe(x)));
      if (x.numel() > 0 && (x.min().item<int64_t>() < 0 || x.max().item<int64_t>() >= cfg_.vocab))
        return fail(fmt::format("{}: token ids must lie in [0, {}), got ids in [{}, {}]",
                                cfg_.files.front(), cfg_.vocab, x.min().item<int64_t>(),
                                x.max().item<int64_t>()));
      return {};
    }
    std::vector<int64_t> want{x.dim() > 0 ? x.size(0) : 0};
    want.insert(want.end(), cfg_.input_shape.begin(), cfg_.input_shape.end());
    auto features = c10::multiply_integers(cfg_.input_shape);
    bool flat = x.dim() == 2 && x.size(1) == features;
    if (!x.is_floating_point() || (x.sizes().vec() != want && !flat) || x.size(0) < 1)
      return fail(fmt::format("{}: expects float [B, {}] (or flat rows [B, {}]), got {}",
                              cfg_.files.front(), fmt::join(cfg_.input_shape, ", "), features,
                              describe(x)));
    return {};
  }

private:
  torchscript_config cfg_;
};

/// The last stage's head: the last file already produced what the loss takes.
class loss_input : public stage_layer {
public:
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
  status check_input(const torch::Tensor&) const override { return {}; }
};

/// Checks untrusted targets of the last stage: their dtype and shape for the stage's input
/// batch, and (for class ids) the vocabulary.
status check_targets(const torchscript_config& cfg, const tensor_shape& output,
                     const torch::Tensor& input, const torch::Tensor& targets) {
  auto batch = input.dim() > 0 ? input.size(0) : 0;
  auto ids = target_sizes(cfg, batch);
  if (cfg.loss == loss_kind::mse && targets.is_floating_point()) {
    auto want = output.sizes;
    want[0] = batch;
    if (targets.sizes().vec() != want)
      return fail(fmt::format("float MSE targets must have shape {}, got {}",
                              c10::str(c10::IntArrayRef(want)), describe(targets)));
    return {};
  }
  if (targets.scalar_type() != torch::kLong || targets.sizes().vec() != ids)
    return fail(fmt::format("targets must be int64 {}, got {}", c10::str(c10::IntArrayRef(ids)),
                            describe(targets)));
  if (targets.numel() > 0
      && (targets.min().item<int64_t>() < 0 || targets.max().item<int64_t>() >= cfg.vocab))
    return fail(fmt::format("target ids must lie in [0, {}), got ids in [{}, {}]", cfg.vocab,
                            targets.min().item<int64_t>(), targets.max().item<int64_t>()));
  return {};
}

/// The stage's loss; `loss` is the loaded loss file when the loss is scripted.
stage_loss make_loss(const torchscript_config& cfg, const tensor_shape& output,
                     std::optional<script> loss) {
  stage_loss l;
  l.check = [cfg, output](const torch::Tensor& input, const torch::Tensor& targets) {
    return check_targets(cfg, output, input, targets);
  };
  if (cfg.loss != loss_kind::scripted) {
    l.compute = [kind = cfg.loss](const torch::Tensor& out, const torch::Tensor& targets) {
      return builtin_loss(kind, out, targets);
    };
    return l;
  }
  auto module = std::make_shared<torch::jit::Module>(std::move(loss->module));
  l.compute = [module](const torch::Tensor& out, const torch::Tensor& targets) {
    auto v = module->forward({out, targets});
    TORCH_CHECK(v.isTensor(), "the scripted loss returned ", v.tagKind(), ", not a tensor");
    return v.toTensor().reshape({});
  };
  return l;
}

/// The modules a stage build keeps from the one load of its files.
struct loaded {
  /// Files [begin, end) are kept, in order, in `blocks`.
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<script> blocks;
  /// The loss file (a scripted loss only).
  std::optional<script> loss;
};

/// A copy of `s` to run checks on: a forward in training mode may change buffers or attributes
/// (running statistics), and a stage must start from the file's values.
script probe_copy(const script& s) {
  torch::NoGradGuard no_grad;
  return script{s.file, s.module.deepcopy(), s.takes_seed};
}

/// Loads every file (and the loss file) once and runs the checks of the header comment on a
/// probe batch; with `keep`, hands the loaded modules of its range (and the loss) over unprobed.
result<torchscript_layout> inspect(const torchscript_config& cfg, loaded* keep) {
  if (auto st = validate(cfg); !st)
    return fail(st.what());
  torchscript_layout out;
  auto x = probe_input(cfg, probe_batch);
  std::string note = input_note(cfg);
  for (size_t i = 0; i < cfg.files.size(); ++i) {
    auto s = load_script(cfg.files[i], false);
    if (!s)
      return s.error();
    for (const auto& b : s->module.named_buffers(true))
      if (b.value.is_floating_point() && !torch::isfinite(b.value).all().item<bool>())
        return fail(fmt::format("{}: buffer '{}' holds non-finite values; float buffers travel "
                                "with the state and are averaged (compute constants like masks "
                                "in forward instead)",
                                cfg.files[i], b.name));
    for (const auto& p : s->module.parameters(true))
      out.parameters += p.numel();
    out.inputs.push_back(shape_of(x));
    auto index = static_cast<int64_t>(i);
    bool kept = keep && index >= keep->begin && index < keep->end;
    std::optional<script> copy;
    if (kept)
      copy = probe_copy(*s);
    auto y = deterministic_forward(kept ? *copy : *s, x, note);
    if (!y)
      return y.error();
    if (y->dim() < 1 || y->size(0) != probe_batch)
      return fail(fmt::format("{}: returns {} for a batch of {} (the first dimension must stay "
                              "the batch)",
                              cfg.files[i], describe(*y), probe_batch));
    if (i + 1 < cfg.files.size() && !y->is_floating_point())
      return fail(fmt::format("{}: returns {}, but what passes to the next stage must be floating "
                              "point (it carries a gradient back)",
                              cfg.files[i], describe(*y)));
    if (kept)
      keep->blocks.push_back(std::move(*s));
    x = *y;
    note = fmt::format("the output of {}", cfg.files[i]);
  }
  if (auto st = check_output(cfg, cfg.files.back(), x); !st)
    return fail(st.what());
  if (cfg.loss == loss_kind::scripted) {
    auto l = load_script(cfg.loss_file, true);
    if (!l)
      return l.error();
    bool kept = keep && keep->end == static_cast<int64_t>(cfg.files.size());
    std::optional<script> copy;
    if (kept)
      copy = probe_copy(*l);
    if (auto st = check_loss_script(kept ? *copy : *l, cfg, x); !st)
      return fail(st.what());
    if (kept)
      keep->loss = std::move(*l);
  }
  out.output = shape_of(x);
  return out;
}

tensor_shape with_batch(tensor_shape s, int64_t batch) {
  if (!s.sizes.empty())
    s.sizes[0] = batch;
  return s;
}

} // namespace

const char* to_string(loss_kind k) noexcept {
  switch (k) {
    case loss_kind::cross_entropy:
      return "cross_entropy";
    case loss_kind::mse:
      return "mse";
    case loss_kind::scripted:
      return "scripted";
  }
  return "?";
}

status validate(const torchscript_config& cfg) {
  if (cfg.files.empty())
    return fail("a TorchScript model needs at least one file");
  if (cfg.vocab < 1 || cfg.seq_len < 1)
    return fail(fmt::format("TorchScript model sizes must be positive: vocab {}, seq_len {}",
                            cfg.vocab, cfg.seq_len));
  for (auto v : cfg.input_shape)
    if (v < 1)
      return fail(fmt::format("input_shape [{}] has a size below 1", fmt::join(cfg.input_shape, ", ")));
  if ((cfg.loss == loss_kind::scripted) != !cfg.loss_file.empty())
    return fail("a loss file goes with the scripted loss, and only with it");
  return {};
}

result<torchscript_layout> inspect_torchscript(const torchscript_config& cfg) {
  return inspect(cfg, nullptr);
}

result<std::shared_ptr<stage_module>> make_torchscript_stage(const torchscript_config& cfg,
                                                             int64_t begin, int64_t end) {
  if (auto st = validate(cfg); !st)
    return fail(st.what());
  auto depth = static_cast<int64_t>(cfg.files.size());
  if (begin < 0 || end > depth || begin >= end)
    return fail(fmt::format("stage blocks [{}, {}) are not a non-empty range of the {} files",
                            begin, end, depth));
  // One load per file: the checks run on copies, the stage keeps the loaded modules untouched.
  loaded kept;
  kept.begin = begin;
  kept.end = end;
  auto layout = inspect(cfg, &kept);
  if (!layout)
    return layout.error();
  std::vector<std::shared_ptr<stage_layer>> blocks;
  for (auto i = begin; i < end; ++i) {
    auto in = layout->inputs[static_cast<size_t>(i)];
    blocks.push_back(std::make_shared<scripted_layer>(
      std::move(kept.blocks[static_cast<size_t>(i - begin)]), std::move(in)));
  }
  std::shared_ptr<stage_layer> input;
  if (begin == 0)
    input = std::make_shared<model_input>(cfg);
  std::shared_ptr<stage_layer> head;
  if (end == depth)
    head = std::make_shared<loss_input>();
  auto stage = std::make_shared<stage_module>(depth, begin, std::move(input), std::move(blocks),
                                              std::move(head));
  if (end == depth)
    stage->set_loss(make_loss(cfg, layout->output, std::move(kept.loss)));
  stage->train();
  return stage;
}

model_spec torchscript_model(const torchscript_config& cfg) {
  return model_spec{"torchscript", cfg};
}

model_entry torchscript_entry() {
  return make_model_entry<torchscript_config>(
    "torchscript",
    [](const torchscript_config& c) -> result<int64_t> {
      if (auto st = validate(c); !st)
        return fail(st.what());
      return static_cast<int64_t>(c.files.size());
    },
    [](const torchscript_config& c, int64_t begin, int64_t end) {
      return make_torchscript_stage(c, begin, end);
    },
    [](const torchscript_config& c, int64_t block, int64_t batch) -> result<tensor_shape> {
      auto layout = inspect_torchscript(c);
      if (!layout)
        return layout.error();
      if (block < 0 || block >= static_cast<int64_t>(layout->inputs.size()) || batch < 1)
        return fail(fmt::format("no block {} with a batch of {} in a model of {} files", block,
                                batch, layout->inputs.size()));
      return with_batch(layout->inputs[static_cast<size_t>(block)], batch);
    },
    [](const torchscript_config& c, int64_t batch) -> result<tensor_shape> {
      if (batch < 1)
        return fail(fmt::format("a microbatch has at least 1 sample, not {}", batch));
      return tensor_shape{target_sizes(c, batch), torch::kLong};
    });
}

status save_state_dict(const named_tensors& tensors, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors)
    dict.insert(name, t.detach().to(torch::kCPU).contiguous());
  std::vector<char> bytes;
  try {
    bytes = torch::pickle_save(c10::IValue(dict));
  } catch (const std::exception& e) {
    return fail(fmt::format("{}: cannot serialize the state dict: {}", path, short_error(e)));
  }
  std::ofstream out{path, std::ios::binary | std::ios::trunc};
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out)
    return fail(fmt::format("{}: cannot write the state dict", path));
  return {};
}

result<named_tensors> load_state_dict(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return fail(fmt::format("{}: no such file", path));
  std::vector<char> bytes{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  try {
    auto v = torch::pickle_load(bytes);
    if (!v.isGenericDict())
      return fail(fmt::format("{}: holds {}, not a dict of tensors", path, v.tagKind()));
    named_tensors out;
    for (const auto& kv : v.toGenericDict()) {
      if (!kv.key().isString() || !kv.value().isTensor())
        return fail(fmt::format("{}: a state dict maps names to tensors", path));
      out.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
    }
    return out;
  } catch (const std::exception& e) {
    return fail(fmt::format("{}: not a state dict ({})", path, short_error(e)));
  }
}

result<exported_files> export_stage(stage_module& stage, int64_t index, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return fail(fmt::format("{}: cannot create the export directory: {}", dir, ec.message()));
  exported_files out;
  // Saved in evaluation mode (dropout off, running statistics used), as PyTorch users load a
  // model to use it; the stage goes back to the mode it was in.
  struct mode_guard {
    stage_module& stage;
    bool was = stage.is_training();
    ~mode_guard() { stage.train(was); }
  } mode{stage};
  stage.eval();
  bool scripted = false;
  for (const auto& child : stage.modules(false)) {
    auto* layer = dynamic_cast<scripted_layer*>(child.get());
    if (!layer)
      continue;
    scripted = true;
    auto stem = fs::path{layer->file()}.stem().string();
    auto pt = (fs::path{dir} / (stem + ".pt")).string();
    auto sd = (fs::path{dir} / (stem + ".state_dict.pt")).string();
    try {
      layer->module().save(pt);
    } catch (const std::exception& e) {
      return fail(fmt::format("{}: cannot save the TorchScript module: {}", pt, short_error(e)));
    }
    named_tensors tensors;
    for (const auto& p : layer->module().named_parameters(true))
      tensors.emplace_back(p.name, p.value);
    for (const auto& b : layer->module().named_buffers(true))
      tensors.emplace_back(b.name, b.value);
    if (auto st = save_state_dict(tensors, sd); !st)
      return fail(st.what());
    out.torchscript.push_back(pt);
    out.state_dicts.push_back(sd);
  }
  if (!scripted) {
    auto sd = (fs::path{dir} / fmt::format("stage{}.state_dict.pt", index)).string();
    named_tensors tensors;
    for (const auto& p : stage.named_parameters(true))
      tensors.emplace_back(p.key(), p.value());
    if (auto st = save_state_dict(tensors, sd); !st)
      return fail(st.what());
    out.state_dicts.push_back(sd);
  }
  return out;
}

} // namespace starling::kernels
