// Data sources by name, from options structs with documented defaults. The config reader fills
// `data_source_options` from YAML; kernels stay free of YAML.
#pragma once

#include "kernels/data/corpus.hpp"
#include "kernels/data/data_source.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/data/text_source.hpp"
#include "kernels/data/token_source.hpp"

#include <memory>
#include <string>
#include <vector>

namespace starling::kernels {

/// Everything a registered source may need; only the part `kind` names is read.
struct data_source_options {
  /// "text" (the byte-level corpus), "idx" (Fashion-MNIST images) or "tokens" (a token file).
  std::string kind = "text";
  /// For "text": where the corpus comes from.
  corpus_options corpus;
  /// For "text": how the corpus is cut into windows.
  text_source_options text;
  /// For "idx": which images.
  idx_source_options idx;
  /// For "tokens": which file and how it is cut.
  token_source_options tokens;
  /// For "tokens": the held-out token file (same dtype, vocabulary and cut); empty: none.
  std::string eval_path;
};

/// A training source and the held-out one beside it (null when the kind has none).
struct data_split {
  std::shared_ptr<const data_source> train;
  std::shared_ptr<const data_source> eval;
};

/// The registered kinds, in the order errors list them.
std::vector<std::string> data_source_kinds();

/// Makes the source `opts.kind` names; fails on an unknown kind (listing the known ones) or with
/// the source's own error.
result<std::shared_ptr<const data_source>> make_data_source(const data_source_options& opts);

/// Makes the training source and its held-out counterpart: for "idx" the test split (every
/// image), for "tokens" the file `eval_path` (none when empty), for "text" none (the corpus'
/// held-out tail is read by `held_out_batches`).
result<data_split> make_data_split(const data_source_options& opts);

/// Sets what a model decides of its data: the windows of "text" and "tokens" are `seq_len`
/// long, and token ids must lie below `vocab`.
void fit_to_model(data_source_options& opts, int64_t seq_len, int64_t vocab);

/// A key that differs between options that make different sources (for caches).
std::string cache_key(const data_source_options& opts);

} // namespace starling::kernels
