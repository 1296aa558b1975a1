#include "kernels/models/registry.hpp"

#include "kernels/models/torchscript.hpp"

#include <fmt/format.h>

namespace starling::kernels {

namespace {

status check_mlp(const mlp_config& c) {
  if (c.inputs < 1 || c.width < 1 || c.layers < 1 || c.classes < 1)
    return fail(fmt::format("mlp sizes must be positive: inputs {}, width {}, layers {}, "
                            "classes {}",
                            c.inputs, c.width, c.layers, c.classes));
  return {};
}

/// Checks a boundary request against a model of `depth` blocks.
status check_boundary(int64_t depth, int64_t block, int64_t batch) {
  if (block < 0 || block >= depth)
    return fail(fmt::format("block {} is outside a model of {} blocks", block, depth));
  if (batch < 1)
    return fail(fmt::format("a microbatch has at least 1 sample, not {}", batch));
  return {};
}

model_entry gpt_entry() {
  return make_model_entry<gpt_config>(
    "gpt",
    [](const gpt_config& c) -> result<int64_t> {
      if (auto st = validate(c); !st)
        return fail(st.what());
      return c.layers;
    },
    [](const gpt_config& c, int64_t begin, int64_t end) { return make_gpt_stage(c, begin, end); },
    [](const gpt_config& c, int64_t block, int64_t batch) -> result<tensor_shape> {
      if (auto st = validate(c); !st)
        return fail(st.what());
      if (auto st = check_boundary(c.layers, block, batch); !st)
        return fail(st.what());
      if (block == 0)
        return tensor_shape{{batch, c.seq_len}, torch::kLong}; // bytes
      return tensor_shape{{batch, c.seq_len, c.width}, torch::kFloat};
    },
    [](const gpt_config& c, int64_t batch) -> result<tensor_shape> {
      if (batch < 1)
        return fail(fmt::format("a microbatch has at least 1 sample, not {}", batch));
      return tensor_shape{{batch, c.seq_len}, torch::kLong}; // the next byte at every position
    });
}

model_entry mlp_entry() {
  return make_model_entry<mlp_config>(
    "mlp",
    [](const mlp_config& c) -> result<int64_t> {
      if (auto st = check_mlp(c); !st)
        return fail(st.what());
      return c.layers;
    },
    [](const mlp_config& c, int64_t begin, int64_t end) { return make_mlp_stage(c, begin, end); },
    [](const mlp_config& c, int64_t block, int64_t batch) -> result<tensor_shape> {
      if (auto st = check_mlp(c); !st)
        return fail(st.what());
      if (auto st = check_boundary(c.layers, block, batch); !st)
        return fail(st.what());
      return tensor_shape{{batch, block == 0 ? c.inputs : c.width}, torch::kFloat};
    },
    [](const mlp_config&, int64_t batch) -> result<tensor_shape> {
      if (batch < 1)
        return fail(fmt::format("a microbatch has at least 1 sample, not {}", batch));
      return tensor_shape{{batch}, torch::kLong}; // one class label per sample
    });
}

} // namespace

model_spec gpt_model(const gpt_config& cfg) {
  return model_spec{"gpt", cfg};
}

model_spec mlp_model(const mlp_config& cfg) {
  return model_spec{"mlp", cfg};
}

std::shared_ptr<const model_registry> model_registry::builtins() {
  // Immutable once built (a function-local constant, not mutable global state).
  static const std::shared_ptr<const model_registry> instance = [] {
    auto r = std::make_shared<model_registry>();
    (void)r->add("gpt", gpt_entry());
    (void)r->add("mlp", mlp_entry());
    (void)r->add("torchscript", torchscript_entry());
    return r;
  }();
  return instance;
}

status model_registry::add(const std::string& name, model_entry entry) {
  if (name.empty())
    return fail("a model needs a name");
  if (has(name))
    return fail(fmt::format("a model named '{}' is already registered", name));
  if (!entry.depth || !entry.make_stage || !entry.boundary || !entry.targets)
    return fail(fmt::format("model '{}': an entry needs depth, make_stage, boundary and targets",
                            name));
  entries_.emplace(name, std::move(entry));
  return {};
}

std::vector<std::string> model_registry::names() const {
  std::vector<std::string> out;
  for (auto& kv : entries_)
    out.push_back(kv.first);
  return out;
}

result<const model_entry*> model_registry::find(const std::string& name) const {
  auto i = entries_.find(name);
  if (i == entries_.end())
    return fail(fmt::format("unknown model '{}' (registered: {})", name,
                            fmt::join(names(), ", ")));
  return &i->second;
}

result<int64_t> model_registry::depth(const model_spec& spec) const {
  auto e = find(spec.name);
  if (!e)
    return e.error();
  return (*e)->depth(spec.options);
}

result<std::shared_ptr<stage_module>> model_registry::make_stage(const model_spec& spec,
                                                                 int64_t begin,
                                                                 int64_t end) const {
  auto e = find(spec.name);
  if (!e)
    return e.error();
  auto d = (*e)->depth(spec.options);
  if (!d)
    return d.error();
  if (begin < 0 || end <= begin || end > *d)
    return fail(fmt::format("model '{}' has blocks [0, {}): cannot hold [{}, {})", spec.name, *d,
                            begin, end));
  return (*e)->make_stage(spec.options, begin, end);
}

result<tensor_shape> model_registry::boundary(const model_spec& spec, int64_t block,
                                              int64_t batch) const {
  auto e = find(spec.name);
  if (!e)
    return e.error();
  return (*e)->boundary(spec.options, block, batch);
}

result<tensor_shape> model_registry::targets(const model_spec& spec, int64_t batch) const {
  auto e = find(spec.name);
  if (!e)
    return e.error();
  return (*e)->targets(spec.options, batch);
}

} // namespace starling::kernels
