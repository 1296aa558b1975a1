#include "actors/dp_peer/backend.hpp"

#include <cmath>
#include <exception>
#include <functional>
#include <numeric>

#include <fmt/format.h>

#include "kernels/flat.hpp"
#include "kernels/seeded_hash.hpp"
#include "kernels/t2i/sampler.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::actors::dp_peer {

namespace {

/// The state in the donor message form.
messages::stage_state to_message(const collab::model_state& s, uint64_t step) {
  messages::stage_state out;
  out.params.tensor = s.params;
  if (s.optimizer.packed.empty())
    out.moments.tensor = s.optimizer.moments;
  out.packed_moments = s.optimizer.packed;
  out.optimizer_steps = s.optimizer.steps;
  out.steps = step;
  if (s.buffers.defined() && s.buffers.numel() > 0)
    out.buffers.tensor = s.buffers;
  if (s.int_buffers.defined() && s.int_buffers.numel() > 0)
    out.int_buffers.tensor = s.int_buffers;
  return out;
}

class torch_backend : public backend {
public:
  torch_backend(torch_backend_options opts, std::shared_ptr<kernels::stage_module> model,
                collab::grad_accumulator acc,
                std::shared_ptr<const kernels::data_source> train,
                std::shared_ptr<const kernels::data_source> eval)
      : opts_(std::move(opts)),
        model_(std::move(model)),
        acc_(std::move(acc)),
        train_(std::move(train)),
        eval_(std::move(eval)) {
    // Ready: the model starts at the collaboration's seeded initialization.
  }

  std::string describe() const override {
    if (opts_.spec)
      return fmt::format("model '{}' ({} parameters) on {}", opts_.spec->name, numel(),
                         train_->describe());
    return fmt::format("MLP {}-{}x{}-{} ({} parameters) on {}", opts_.model.inputs,
                       opts_.model.width, opts_.model.layers, opts_.model.classes, numel(),
                       train_->describe());
  }

  int64_t numel() const override { return acc_.numel(); }

  result<microbatch_result> compute(uint64_t index) override {
    auto ids = microbatch_ids(train_->size(), opts_.stream, index);
    if (!ids)
      return ids.error();
    auto batch = train_->batch(*ids);
    if (!batch)
      return batch.error();
    try {
      // Training mode, as PyTorch trains: dropout on, batch norm on batch statistics (updating
      // its running ones once: nothing is recomputed). The dropout seed is a function of public
      // values, so a validator can recompute this microbatch.
      model_->train();
      auto seed = kernels::splitmix64_combine(
        kernels::splitmix64_combine(opts_.stream.seed, opts_.stream.stream), index);
      auto loss = model_->compute(batch->inputs, batch->targets, seed);
      loss.backward();
      if (auto st = acc_.accumulate(ids->size()); !st)
        return fail(st.what());
      return microbatch_result{ids->size(), loss.item<double>()};
    } catch (const std::exception& e) {
      for (auto& p : acc_.params())
        if (p.grad().defined())
          p.mutable_grad().zero_();
      return fail(fmt::format("microbatch {} failed: {}", index, e.what()));
    }
  }

  uint64_t accumulated() const override { return acc_.samples(); }

  collab::taken_gradient take() override { return acc_.take(); }

  void discard() override { acc_.discard(); }

  status apply(const torch::Tensor& mean_gradient) override {
    auto r = acc_.apply(mean_gradient);
    if (!r)
      return fail(r.error().what);
    return {};
  }

  result<messages::stage_state> export_state(uint64_t step) const override {
    // A donor's state: lamb8's in its codes and scales.
    auto s = acc_.export_state(kernels::moments_form::compact);
    if (!s)
      return s.error();
    return to_message(*s, step);
  }

  status import_state(const messages::stage_state& s) override {
    if (!s.params.ok() || !s.moments.ok())
      return fail(fmt::format("the downloaded state arrived broken: {}",
                              s.params.ok() ? s.moments.error : s.params.error));
    if (!s.params.tensor.defined() || (!s.moments.tensor.defined() && s.packed_moments.empty()))
      return fail("the downloaded state lacks parameters or moments");
    collab::model_state m;
    m.params = s.params.tensor.to(torch::kFloat).reshape({-1});
    if (s.moments.tensor.defined())
      m.optimizer.moments = s.moments.tensor.to(torch::kFloat).reshape({-1});
    m.optimizer.packed = s.packed_moments;
    m.optimizer.steps = s.optimizer_steps;
    for (const auto* b : {&s.buffers, &s.int_buffers})
      if (!b->ok())
        return fail(fmt::format("the downloaded state's buffers arrived broken: {}", b->error));
    if (s.buffers.tensor.defined())
      m.buffers = s.buffers.tensor.reshape({-1});
    if (s.int_buffers.tensor.defined())
      m.int_buffers = s.int_buffers.tensor.reshape({-1});
    return acc_.import_state(m);
  }

  result<torch::Tensor> state_vector() const override { return acc_.state_vector(); }

  status load_state_vector(const torch::Tensor& v) override { return acc_.load_state_vector(v); }

  std::optional<evaluation> evaluate() override {
    if (!eval_ || opts_.eval_samples == 0)
      return std::nullopt;
    auto n = std::min<uint64_t>(opts_.eval_samples, eval_->size());
    evaluation e;
    torch::NoGradGuard guard;
    model_->eval();
    constexpr uint64_t chunk = 500;
    double loss = 0;
    uint64_t correct = 0;
    int64_t targets = 0;
    for (uint64_t first = 0; first < n; first += chunk) {
      std::vector<uint64_t> ids;
      for (auto i = first; i < std::min(n, first + chunk); ++i)
        ids.push_back(i);
      auto b = eval_->batch(ids);
      if (!b)
        return std::nullopt;
      auto logits = mlp_logits(*model_, b->inputs);
      if (!logits)
        return std::nullopt;
      loss += model_->loss(*logits, b->targets).item<double>() * static_cast<double>(ids.size());
      auto predicted = logits->argmax(-1);
      auto wanted = b->targets;
      if (opts_.t2i) {
        // The caption positions are given, not predicted: only the image tokens count.
        auto from = opts_.t2i->prompt_length() - 1;
        predicted = predicted.slice(1, from);
        wanted = wanted.slice(1, from);
      }
      correct += predicted.eq(wanted).sum().item<int64_t>();
      targets += wanted.numel();
    }
    model_->train();
    e.samples = n;
    e.loss = loss / static_cast<double>(n);
    e.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, targets));
    return e;
  }

  std::vector<torch::Tensor> parameters() override { return acc_.params(); }

  result<uint64_t> inner_step() override {
    auto g = acc_.take();
    if (g.samples == 0)
      return uint64_t{0};
    if (auto r = acc_.apply(g.mean); !r)
      return r.error();
    return g.samples;
  }

  std::shared_ptr<kernels::stage_module> module() override { return model_; }

private:
  torch_backend_options opts_;
  std::shared_ptr<kernels::stage_module> model_;
  collab::grad_accumulator acc_;
  std::shared_ptr<const kernels::data_source> train_;
  std::shared_ptr<const kernels::data_source> eval_;
};

/// The cost model: a vector of the model's size that averaging moves; no computation.
class modeled_backend : public backend {
public:
  explicit modeled_backend(const modeled_backend_options& opts)
      : opts_(opts), params_(torch::zeros({opts.numel}, torch::kFloat)) {
    // Zeros: the values do not matter, their size does.
  }

  std::string describe() const override {
    return fmt::format("cost model ({} parameters, {} samples per microbatch)", opts_.numel,
                       opts_.microbatch);
  }

  int64_t numel() const override { return opts_.numel; }

  result<microbatch_result> compute(uint64_t) override {
    samples_ += opts_.microbatch;
    return microbatch_result{opts_.microbatch, std::numeric_limits<double>::quiet_NaN()};
  }

  uint64_t accumulated() const override { return samples_; }

  collab::taken_gradient take() override {
    collab::taken_gradient g;
    g.samples = samples_;
    g.mean = torch::zeros({opts_.numel}, torch::kFloat);
    samples_ = 0;
    return g;
  }

  void discard() override { samples_ = 0; }

  status apply(const torch::Tensor& g) override {
    if (!g.defined() || g.numel() != opts_.numel)
      return fail(fmt::format("a gradient of {} elements was expected, got {}", opts_.numel,
                              g.defined() ? g.numel() : 0));
    return {};
  }

  result<messages::stage_state> export_state(uint64_t step) const override {
    collab::model_state s;
    s.params = params_;
    s.optimizer.moments = torch::zeros({2 * opts_.numel}, torch::kFloat);
    s.optimizer.steps = {step};
    return to_message(s, step);
  }

  status import_state(const messages::stage_state& s) override {
    if (!s.params.ok() || !s.params.tensor.defined() || s.params.tensor.numel() != opts_.numel)
      return fail(fmt::format("a state of {} parameters was expected", opts_.numel));
    return {};
  }

  result<torch::Tensor> state_vector() const override {
    return torch::zeros({3 * opts_.numel}, torch::kFloat);
  }

  status load_state_vector(const torch::Tensor& v) override {
    if (!v.defined() || v.numel() != 3 * opts_.numel)
      return fail(fmt::format("a state vector of {} elements was expected", 3 * opts_.numel));
    return {};
  }

  std::optional<evaluation> evaluate() override { return std::nullopt; }

  std::vector<torch::Tensor> parameters() override { return {params_}; }

  result<uint64_t> inner_step() override {
    auto n = samples_;
    samples_ = 0;
    return n;
  }

  std::shared_ptr<kernels::stage_module> module() override { return nullptr; }

private:
  modeled_backend_options opts_;
  torch::Tensor params_;
  uint64_t samples_ = 0;
};

} // namespace

backend::~backend() = default;

result<std::vector<uint64_t>> microbatch_ids(uint64_t samples, const stream_options& s,
                                             uint64_t index) {
  kernels::loader_options lo;
  lo.seed = kernels::splitmix64_combine(s.seed, s.stream, 0x632BE59BD9B4E019ull);
  lo.shards = 1;
  lo.shard = 0;
  return kernels::batch_for_step(samples, lo, index, s.microbatch);
}

result<torch::Tensor> mlp_logits(kernels::stage_module& model, const torch::Tensor& input) {
  try {
    return model.predict(input);
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot compute logits: {}", e.what()));
  }
}

result<std::unique_ptr<backend>> make_torch_backend(
  const torch_backend_options& opts, std::shared_ptr<const kernels::data_source> train,
  std::shared_ptr<const kernels::data_source> eval) {
  if (!train)
    return fail("the torch backend needs a training data source");
  if (opts.stream.microbatch == 0)
    return fail("microbatch must be at least 1 sample");
  result<std::shared_ptr<kernels::stage_module>> model = fail("unset");
  if (opts.spec) {
    auto models = kernels::model_registry::builtins();
    auto depth = models->depth(*opts.spec);
    if (!depth)
      return depth.error();
    model = models->make_stage(*opts.spec, 0, *depth);
  } else {
    // Sizes left at 0 come from the data: the input layer takes one sample, the head its classes.
    auto cfg = opts.model;
    auto shape = train->shape();
    if (cfg.inputs == 0)
      cfg.inputs =
          std::accumulate(shape.input.begin(), shape.input.end(), int64_t{1}, std::multiplies<>());
    if (cfg.classes == 0)
      cfg.classes = shape.classes;
    model = kernels::make_mlp(cfg);
  }
  if (!model)
    return model.error();
  if (opts.t2i) {
    if (!opts.spec || opts.spec->name != "gpt")
      return fail("a text-to-image layout goes with the built-in GPT (model kind gpt)");
    kernels::use_image_loss(**model, *opts.t2i);
  }
  auto acc = collab::grad_accumulator::make((*model)->ordered_parameters(), opts.optimizer);
  if (!acc)
    return acc.error();
  // Running statistics travel with the state and are averaged in state rounds.
  acc->set_buffers(kernels::split_buffers((*model)->buffers(true)));
  return std::unique_ptr<backend>(new torch_backend(opts, *model, std::move(*acc),
                                                    std::move(train), std::move(eval)));
}

result<std::unique_ptr<backend>> make_modeled_backend(const modeled_backend_options& opts) {
  if (opts.numel < 1)
    return fail(fmt::format("the modeled parameter count must be positive, got {}", opts.numel));
  if (opts.microbatch == 0)
    return fail("microbatch must be at least 1 sample");
  return std::unique_ptr<backend>(new modeled_backend(opts));
}

} // namespace starling::actors::dp_peer
