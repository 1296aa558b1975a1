#include "runtime/graph/model_config.hpp"

#include <fmt/format.h>

#include "runtime/config/reader.hpp"

namespace starling::runtime::graph {

std::vector<std::string> torchscript_keys() {
  return {"kind", "files", "vocab", "seq_len", "input_shape", "loss", "loss_file"};
}

kernels::torchscript_config read_torchscript_model(config_node& m) {
  kernels::torchscript_config c;
  if (!m.has("files"))
    m.fail("missing required key 'files' (the TorchScript files, one per block, in pipeline "
           "order)");
  auto files = m.child("files");
  if (!files.is_sequence())
    files.expected("a list of TorchScript files");
  for (auto& f : files.items())
    c.files.push_back(f.as_string());
  if (c.files.empty())
    files.expected("at least one TorchScript file");
  read_int(m, "vocab", c.vocab, 1, int64_t{1} << 31);
  read_int(m, "seq_len", c.seq_len, 1, 1 << 20);
  if (m.has("input_shape")) {
    for (auto& v : m.child("input_shape").items()) {
      auto s = v.as_int();
      if (s < 1)
        v.expected("a positive size");
      c.input_shape.push_back(s);
    }
  }
  std::string loss = "cross_entropy";
  read_choice(m, "loss", loss, {"cross_entropy", "mse", "scripted"});
  c.loss = loss == "mse"        ? kernels::loss_kind::mse
           : loss == "scripted" ? kernels::loss_kind::scripted
                                : kernels::loss_kind::cross_entropy;
  read(m, "loss_file", c.loss_file);
  if (c.loss == kernels::loss_kind::scripted && c.loss_file.empty())
    m.fail("loss: scripted needs 'loss_file' (a scripted module forward(output, targets))");
  if (c.loss != kernels::loss_kind::scripted && !c.loss_file.empty())
    m.child("loss_file").fail("a loss file goes with loss: scripted");
  if (auto layout = kernels::inspect_torchscript(c); !layout)
    m.fail(layout.error().what);
  return c;
}

void read_data_section(config_node& d, kernels::data_source_options& out,
                       const std::vector<std::string>& kinds,
                       const std::vector<std::string>& extra) {
  std::vector<std::string> keys = {"kind", "path", "eval_path", "dtype", "stride"};
  keys.insert(keys.end(), extra.begin(), extra.end());
  d.allow(keys);
  read_choice(d, "kind", out.kind, kinds);
  if (out.kind == "tokens") {
    if (!d.has("path"))
      d.fail("missing required key 'path' (a raw uint16 or uint32 token file)");
    out.tokens.file.path = d.child("path").as_string();
    read(d, "eval_path", out.eval_path);
    if (d.has("dtype")) {
      auto t = kernels::parse_token_dtype(d.child("dtype").as_string());
      if (!t)
        d.child("dtype").expected("uint16 | uint32");
      out.tokens.file.dtype = *t;
    }
  } else if (d.has("path") || d.has("eval_path") || d.has("dtype")) {
    d.fail(fmt::format("'path', 'eval_path' and 'dtype' belong to kind: tokens (kind {} reads {})",
                       out.kind,
                       out.kind == "idx" ? "Fashion-MNIST from data_dir" : "the KJV corpus"));
  }
  if (d.has("stride")) {
    if (out.kind == "idx")
      d.child("stride").fail("belongs to kind: text or tokens (windows; kind idx reads images)");
    int64_t stride = 0;
    read_int(d, "stride", stride, 0, INT64_MAX);
    out.text.stride = stride;
    out.tokens.stride = stride;
  }
}

} // namespace starling::runtime::graph
