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

result<data_split> make_data_split(const data_source_options& opts) {
  auto train = make_data_source(opts);
  if (!train)
    return train.error();
  data_split out{*train, nullptr};
  auto held_out = opts;
  if (opts.kind == "idx") {
    held_out.idx.train = false;
    held_out.idx.max_items = 0;
  } else if (opts.kind == "tokens" && !opts.eval_path.empty()) {
    held_out.tokens.file.path = opts.eval_path;
  } else {
    return out;
  }
  auto eval = make_data_source(held_out);
  if (!eval)
    return eval.error();
  out.eval = *eval;
  return out;
}

void fit_to_model(data_source_options& opts, int64_t seq_len, int64_t vocab) {
  opts.text.seq_len = seq_len;
  opts.tokens.seq_len = seq_len;
  opts.tokens.file.vocab_size = static_cast<uint64_t>(vocab);
}

std::string cache_key(const data_source_options& opts) {
  auto& c = opts.corpus;
  auto& i = opts.idx;
  auto& t = opts.tokens;
  return fmt::format("{}|text {} {} {} {} {}|idx {} {} {} {} {} {}|tokens {} {} {} {} {} {} {}",
                     opts.kind, c.bible_command, c.fallback_dir, c.held_out_fraction,
                     opts.text.seq_len, opts.text.stride, i.dir, i.train, i.max_items, i.flatten,
                     i.synthetic_when_absent, i.synthetic_seed, t.file.path,
                     to_string(t.file.dtype), t.file.vocab_size, t.file.validate_at_open, t.seq_len,
                     t.stride, opts.eval_path);
}

} // namespace starling::kernels
