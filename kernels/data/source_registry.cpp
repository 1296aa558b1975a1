#include "kernels/data/source_registry.hpp"

#include <fmt/format.h>

namespace starling::kernels {

namespace {

/// Widens a concrete source's result to the interface.
template <class T>
result<std::shared_ptr<const data_source>> widen(result<std::shared_ptr<const T>> r) {
  if (!r)
    return r.error();
  return std::shared_ptr<const data_source>(std::move(*r));
}

result<std::shared_ptr<const data_source>> make_text(const data_source_options& opts) {
  auto c = load_corpus(opts.corpus);
  if (!c)
    return c.error();
  return widen(text_source::make(std::make_shared<const corpus>(std::move(*c)), opts.text));
}

result<std::shared_ptr<const data_source>> make_idx(const data_source_options& opts) {
  return widen(idx_source::load(opts.idx));
}

result<std::shared_ptr<const data_source>> make_tokens(const data_source_options& opts) {
  return widen(token_source::make(opts.tokens));
}

struct entry {
  const char* name;
  result<std::shared_ptr<const data_source>> (*make)(const data_source_options&);
};

/// The registry: a constant table, so there is nothing to register at start-up.
constexpr entry registry[] = {{"text", make_text}, {"idx", make_idx}, {"tokens", make_tokens}};

} // namespace

std::vector<std::string> data_source_kinds() {
  std::vector<std::string> out;
  for (const auto& e : registry)
    out.emplace_back(e.name);
  return out;
}

result<std::shared_ptr<const data_source>> make_data_source(const data_source_options& opts) {
  for (const auto& e : registry)
    if (opts.kind == e.name)
      return e.make(opts);
  return fail(fmt::format("data source `{}`, expected one of: {}", opts.kind,
                          fmt::join(data_source_kinds(), ", ")));
}

} // namespace starling::kernels
