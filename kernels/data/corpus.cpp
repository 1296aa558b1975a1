#include "kernels/data/corpus.hpp"

#include <torch/torch.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

namespace starling::kernels {

corpus::corpus(std::string text, double held_out_fraction, std::string source)
    : text_(std::move(text)), source_(std::move(source)) {
  auto n = static_cast<int64_t>(text_.size());
  auto held = static_cast<int64_t>(static_cast<double>(n) * held_out_fraction);
  train_size_ = n - held;
}

result<std::string> run_command(const std::string& command) {
  auto* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr)
    return fail(fmt::format("cannot run `{}`", command));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0)
    out.append(buf, n);
  auto rc = ::pclose(pipe);
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
    return fail(fmt::format("`{}` failed (status {})", command, rc));
  return out;
}

std::string strip_verse_prefixes(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    auto eol = text.find('\n', pos);
    auto end = eol == std::string::npos ? text.size() : eol + 1;
    // A reference is: optional book number, letters, chapter digits, ':', verse digits, space.
    size_t i = pos;
    while (i < end && std::isdigit(static_cast<unsigned char>(text[i])))
      ++i;
    auto letters = i;
    while (i < end && std::isalpha(static_cast<unsigned char>(text[i])))
      ++i;
    auto chapter = i;
    while (i < end && std::isdigit(static_cast<unsigned char>(text[i])))
      ++i;
    bool is_ref = i > letters && chapter > letters && i > chapter && i < end && text[i] == ':';
    if (is_ref) {
      auto verse = ++i;
      while (i < end && std::isdigit(static_cast<unsigned char>(text[i])))
        ++i;
      is_ref = i > verse && i < end && text[i] == ' ';
    }
    out.append(text, is_ref ? i + 1 : pos, end - (is_ref ? i + 1 : pos));
    pos = end;
  }
  return out;
}

namespace {

result<std::string> read_fallback(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return fail(fmt::format("fallback corpus directory `{}` does not exist", dir));
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".txt")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  if (text.empty())
    return fail(fmt::format("no text in `{}/*.txt`", dir));
  return text;
}

} // namespace

result<corpus> load_corpus(const corpus_options& opts) {
  if (!(opts.held_out_fraction >= 0.0 && opts.held_out_fraction < 1.0))
    return fail(fmt::format("held_out_fraction must be in [0, 1), got {}", opts.held_out_fraction));
  if (!opts.bible_command.empty()) {
    if (auto out = run_command(opts.bible_command); out.ok()) {
      auto text = strip_verse_prefixes(*out);
      if (!text.empty())
        return corpus(std::move(text), opts.held_out_fraction, "bible");
    }
  }
  auto text = read_fallback(opts.fallback_dir);
  if (!text)
    return fail(
        fmt::format("no corpus: `{}` gave no text and {}", opts.bible_command, text.error().what));
  return corpus(std::move(*text), opts.held_out_fraction, opts.fallback_dir);
}

text_sampler::text_sampler(const corpus& c, int64_t begin, int64_t end, int64_t batch,
                           int64_t seq_len)
    : corpus_(&c), begin_(begin), end_(end), batch_(batch), seq_len_(seq_len) {}

result<text_sampler> text_sampler::make(const corpus& c, int64_t shard, int64_t shards,
                                        int64_t batch, int64_t seq_len) {
  if (shards < 1 || shard < 0 || shard >= shards || batch < 1 || seq_len < 1)
    return fail(fmt::format("invalid sampler: shard {} of {}, batch {}, seq_len {}", shard, shards,
                            batch, seq_len));
  auto begin = c.train_size() * shard / shards;
  auto end = c.train_size() * (shard + 1) / shards;
  if (end - begin < seq_len + 1)
    return fail(fmt::format("shard {} of {} has {} bytes, fewer than one window of {}", shard,
                            shards, end - begin, seq_len + 1));
  return text_sampler(c, begin, end, batch, seq_len);
}

text_batch text_sampler::sample(std::mt19937_64& gen) const {
  // A window needs seq_len + 1 bytes, all inside [begin_, end_).
  std::uniform_int_distribution<int64_t> start(begin_, end_ - seq_len_ - 1);
  auto window = torch::empty({batch_, seq_len_ + 1}, torch::kLong);
  auto* w = window.data_ptr<int64_t>();
  auto* bytes = reinterpret_cast<const unsigned char*>(corpus_->text().data());
  for (int64_t b = 0; b < batch_; ++b) {
    auto s = start(gen);
    for (int64_t t = 0; t <= seq_len_; ++t)
      w[b * (seq_len_ + 1) + t] = bytes[s + t];
  }
  return {window.narrow(1, 0, seq_len_).contiguous(), window.narrow(1, 1, seq_len_).contiguous()};
}

result<std::vector<text_batch>> held_out_batches(const corpus& c, int64_t batch, int64_t seq_len,
                                                 int64_t max_batches) {
  if (batch < 1 || seq_len < 1 || max_batches < 1)
    return fail(fmt::format("invalid held-out batches: batch {}, seq_len {}, max {}", batch,
                            seq_len, max_batches));
  auto windows = (c.size() - c.train_size() - 1) / seq_len;
  if (windows < 1)
    return fail(fmt::format("held-out tail of {} bytes is shorter than one window of {}",
                            c.size() - c.train_size(), seq_len + 1));
  auto* bytes = reinterpret_cast<const unsigned char*>(c.text().data());
  std::vector<text_batch> out;
  int64_t next = 0;
  while (next < windows && static_cast<int64_t>(out.size()) < max_batches) {
    auto n = std::min(batch, windows - next);
    auto window = torch::empty({n, seq_len + 1}, torch::kLong);
    auto* w = window.data_ptr<int64_t>();
    for (int64_t b = 0; b < n; ++b, ++next) {
      auto s = c.train_size() + next * seq_len;
      for (int64_t t = 0; t <= seq_len; ++t)
        w[b * (seq_len + 1) + t] = bytes[s + t];
    }
    out.push_back(
        {window.narrow(1, 0, seq_len).contiguous(), window.narrow(1, 1, seq_len).contiguous()});
  }
  return out;
}

} // namespace starling::kernels
