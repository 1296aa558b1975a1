// Models by name: a stage builds "model `name` with these options" instead of a hard-coded
// config. The built-ins are the byte-level GPT ("gpt", options `gpt_config`), the MLP ("mlp",
// options `mlp_config`) and scripted PyTorch models ("torchscript", options `torchscript_config`
// in torchscript.hpp); a program adds its own models to a registry of its own. Pure: no YAML
// (the config reader turns a map into the options), no CAF.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/models/gpt.hpp"
#include "kernels/models/mlp.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/result.hpp"

namespace starling::kernels {

/// A model by name with its options; `options` holds the registry entry's options type
/// (`gpt_config` for "gpt", `mlp_config` for "mlp").
struct model_spec {
  /// The registry name of the model.
  std::string name = "gpt";
  /// The model's options (copied with the spec).
  std::any options = gpt_config{};
};

/// The spec of the built-in GPT with `cfg`.
model_spec gpt_model(const gpt_config& cfg);

/// The spec of the built-in MLP with `cfg`.
model_spec mlp_model(const mlp_config& cfg);

/// The tensor a stage boundary carries for one microbatch: its sizes and element type.
struct tensor_shape {
  std::vector<int64_t> sizes;
  torch::Dtype dtype = torch::kFloat;
};

/// How a registry builds one model; every function receives the spec's options (already checked
/// to be of the entry's options type when the entry was made with `make_model_entry`).
struct model_entry {
  /// Blocks of the model (the unit stages are cut by); fails on invalid options.
  std::function<result<int64_t>(const std::any& options)> depth;
  /// The stage holding blocks [begin, end) (with the input layer when begin == 0, the head and
  /// loss when end == depth).
  std::function<result<std::shared_ptr<stage_module>>(const std::any& options, int64_t begin,
                                                      int64_t end)>
    make_stage;
  /// The tensor entering block `block` (0: the model's raw input) for `batch` samples.
  std::function<result<tensor_shape>(const std::any& options, int64_t block, int64_t batch)>
    boundary;
  /// The last stage's targets for `batch` samples.
  std::function<result<tensor_shape>(const std::any& options, int64_t batch)> targets;
};

/// Wraps typed functions of `Options` into an entry; a spec whose options hold another type
/// fails naming the model and the type expected.
template <class Options>
model_entry make_model_entry(
  std::string name, std::function<result<int64_t>(const Options&)> depth,
  std::function<result<std::shared_ptr<stage_module>>(const Options&, int64_t, int64_t)> make,
  std::function<result<tensor_shape>(const Options&, int64_t, int64_t)> boundary,
  std::function<result<tensor_shape>(const Options&, int64_t)> targets) {
  auto typed = [name](const std::any& a) -> result<const Options*> {
    if (auto* p = std::any_cast<Options>(&a))
      return p;
    return fail("model '" + name + "' expects its own options type, got another ("
                + std::string{a.has_value() ? a.type().name() : "nothing"} + ")");
  };
  model_entry e;
  e.depth = [typed, depth](const std::any& a) -> result<int64_t> {
    auto o = typed(a);
    if (!o)
      return o.error();
    return depth(**o);
  };
  e.make_stage = [typed, make](const std::any& a, int64_t begin,
                               int64_t end) -> result<std::shared_ptr<stage_module>> {
    auto o = typed(a);
    if (!o)
      return o.error();
    return make(**o, begin, end);
  };
  e.boundary = [typed, boundary](const std::any& a, int64_t block,
                                 int64_t batch) -> result<tensor_shape> {
    auto o = typed(a);
    if (!o)
      return o.error();
    return boundary(**o, block, batch);
  };
  e.targets = [typed, targets](const std::any& a, int64_t batch) -> result<tensor_shape> {
    auto o = typed(a);
    if (!o)
      return o.error();
    return targets(**o, batch);
  };
  return e;
}

/// Models by name. A registry is a plain value owned by whoever builds stages; the built-in one
/// is shared and immutable.
class model_registry {
public:
  /// An empty registry.
  model_registry() = default;

  /// The registry of the built-in models ("gpt", "mlp", "torchscript"), built once and never modified.
  static std::shared_ptr<const model_registry> builtins();

  /// Adds a model; fails when the name is empty, taken, or the entry lacks a function.
  status add(const std::string& name, model_entry entry);

  /// Whether a model of that name is registered.
  bool has(const std::string& name) const { return entries_.count(name) > 0; }

  /// The registered names, sorted.
  std::vector<std::string> names() const;

  /// Blocks of `spec`'s model.
  result<int64_t> depth(const model_spec& spec) const;

  /// The stage of `spec`'s model holding blocks [begin, end).
  result<std::shared_ptr<stage_module>> make_stage(const model_spec& spec, int64_t begin,
                                                   int64_t end) const;

  /// The tensor entering block `block` of `spec`'s model (0: the raw input) for `batch` samples;
  /// fails unless 0 <= block < depth and batch >= 1.
  result<tensor_shape> boundary(const model_spec& spec, int64_t block, int64_t batch) const;

  /// The targets the last stage of `spec`'s model takes for `batch` samples.
  result<tensor_shape> targets(const model_spec& spec, int64_t batch) const;

private:
  result<const model_entry*> find(const std::string& name) const;

  std::map<std::string, model_entry> entries_;
};

} // namespace starling::kernels
