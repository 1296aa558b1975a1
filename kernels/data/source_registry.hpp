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
};

/// The registered kinds, in the order errors list them.
std::vector<std::string> data_source_kinds();

/// Makes the source `opts.kind` names; fails on an unknown kind (listing the known ones) or with
/// the source's own error.
result<std::shared_ptr<const data_source>> make_data_source(const data_source_options& opts);

} // namespace starling::kernels
