#include "kernels/data/source_registry.hpp"

#include "kernels/data/loader.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace starling::test::kernels_data_source_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

struct scratch_dir {
  fs::path path;
  scratch_dir() {
    path = fs::temp_directory_path() / ("starling-source-test-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Bytes 0, 1, 2, ... 199 (mod 256) with a 5% held-out tail of 10 bytes.
std::shared_ptr<const corpus> counting_corpus() {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += static_cast<char>(i);
  return std::make_shared<const corpus>(text, 0.05, "counting");
}

} // namespace

TEST_CASE("text windows cover the training part, targets shifted by one byte") {
  auto s = text_source::make(counting_corpus(), text_source_options{8, 0});
  REQUIRE(s.ok());
  // 190 training bytes, windows of 9 every 8: starts 0, 8, ..., 176 (176 + 9 <= 190).
  CHECK((*s)->size() == 23);
  auto b = (*s)->batch({0, 22, 3});
  REQUIRE(b.ok());
  CHECK((b->inputs.sizes() == c10::IntArrayRef{3, 8}));
  CHECK((b->inputs.scalar_type() == torch::kLong));
  CHECK(b->inputs[1][0].item<int64_t>() == 176);
  CHECK(b->targets[1][7].item<int64_t>() == 184);
  CHECK(b->inputs[2][0].item<int64_t>() == 24);
  CHECK(torch::equal(b->inputs.narrow(1, 1, 7), b->targets.narrow(1, 0, 7)));
  auto out = (*s)->batch({23});
  REQUIRE_FALSE(out.ok());
  CHECK(contains(out.error().what, "sample 23 requested, it has 23 windows"));
  // Overlapping windows with a stride.
  CHECK((*text_source::make(counting_corpus(), text_source_options{8, 1}))->size() == 182);
  CHECK_FALSE(text_source::make(counting_corpus(), text_source_options{190, 0}).ok());
}

TEST_CASE("token windows of a uint16 and a uint32 file come back as int64 ids") {
  scratch_dir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 100; ++i)
    tokens.push_back(1000 * i % 50257);
  for (auto dtype : {token_dtype::uint16, token_dtype::uint32}) {
    const auto path = dir.file(std::string("t-") + to_string(dtype) + ".bin");
    REQUIRE(write_token_file(path, tokens, dtype).ok());
    token_source_options o;
    o.file.path = path;
    o.file.dtype = dtype;
    o.file.vocab_size = 50257;
    o.seq_len = 10;
    auto s = token_source::make(o);
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().what));
    CHECK((*s)->size() == 9); // starts 0, 10, ..., 80 (80 + 11 <= 100)
    auto b = (*s)->batch({4, 0});
    REQUIRE(b.ok());
    for (int64_t t = 0; t < 10; ++t) {
      CHECK(b->inputs[0][t].item<int64_t>() == tokens[40 + t]);
      CHECK(b->targets[0][t].item<int64_t>() == tokens[41 + t]);
      CHECK(b->inputs[1][t].item<int64_t>() == tokens[t]);
    }
  }
}

TEST_CASE("a token file shorter than one window is one clear error") {
  scratch_dir dir;
  REQUIRE(write_token_file(dir.file("short.bin"), {1, 2, 3, 4, 5}, token_dtype::uint16).ok());
  token_source_options o;
  o.file.path = dir.file("short.bin");
  o.file.vocab_size = 256;
  o.seq_len = 8;
  auto s = token_source::make(o);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().what == "token file " + dir.file("short.bin") +
                              ": 5 tokens, fewer than one window of 9 (seq_len 8 + 1)");
}

TEST_CASE("an out-of-vocabulary token met while reading fails the batch") {
  scratch_dir dir;
  REQUIRE(
      write_token_file(dir.file("t.bin"), {1, 2, 3, 4, 999, 6, 7, 8, 9}, token_dtype::uint16).ok());
  token_source_options o;
  o.file.path = dir.file("t.bin");
  o.file.vocab_size = 256;
  o.file.validate_at_open = false;
  o.seq_len = 2;
  auto s = token_source::make(o);
  REQUIRE(s.ok());
  CHECK((*s)->batch({0}).ok());
  auto bad = (*s)->batch({2}); // tokens 4..6
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error().what, "token 4 (byte offset 8) is 999"));
}

TEST_CASE("images come back as pixels and labels, flat or as one channel") {
  auto set = std::make_shared<const image_set>(make_synthetic_images(20, 6, 10, 3));
  auto flat = idx_source::make(set, true);
  auto grid = idx_source::make(set, false);
  REQUIRE(flat.ok());
  REQUIRE(grid.ok());
  auto a = (*flat)->batch({3, 17});
  auto b = (*grid)->batch({3, 17});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((a->inputs.sizes() == c10::IntArrayRef{2, 36}));
  CHECK((b->inputs.sizes() == c10::IntArrayRef{2, 1, 6, 6}));
  CHECK((a->targets.scalar_type() == torch::kLong));
  CHECK(a->targets[0].item<int64_t>() == 3);
  CHECK(a->targets[1].item<int64_t>() == 7);
  CHECK(a->inputs[1][35].item<float>() == set->pixels[17 * 36 + 35]);
  CHECK(torch::equal(a->inputs, b->inputs.view({2, 36})));
  CHECK_FALSE((*flat)->batch({20}).ok());
}

TEST_CASE("the registry makes each kind by name and names the known kinds otherwise") {
  CHECK(data_source_kinds() == std::vector<std::string>{"text", "idx", "tokens"});
  data_source_options o;
  o.kind = "parquet";
  auto bad = make_data_source(o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().what == "data source `parquet`, expected one of: text, idx, tokens");

  o.kind = "text";
  o.corpus.bible_command = "printf 'Ge1:1 In the beginning God created the heaven.\\n'";
  o.corpus.held_out_fraction = 0.0;
  o.text.seq_len = 8;
  auto text = make_data_source(o);
  REQUIRE_MESSAGE(text.ok(), (text.ok() ? "" : text.error().what));
  CHECK(contains((*text)->describe(), "text bible"));

  o.kind = "idx";
  o.idx.dir = "/nonexistent";
  CHECK_FALSE(make_data_source(o).ok()); // absent data is an error by default
  o.idx.synthetic_when_absent = true;
  o.idx.max_items = 50;
  auto images = make_data_source(o);
  REQUIRE(images.ok());
  CHECK((*images)->size() == 50);

  scratch_dir dir;
  REQUIRE(
      write_token_file(dir.file("t.bin"), std::vector<uint32_t>(64, 7), token_dtype::uint16).ok());
  o.kind = "tokens";
  o.tokens.file.path = dir.file("t.bin");
  o.tokens.file.vocab_size = 8;
  o.tokens.seq_len = 7;
  auto tokens = make_data_source(o);
  REQUIRE(tokens.ok());
  CHECK((*tokens)->size() == 9); // windows of 8 every 7: starts 0, 7, ..., 56
}

TEST_CASE("every source says what its samples are to a model, and a split holds its held-out "
          "part") {
  auto set = std::make_shared<const image_set>(make_synthetic_images(20, 6, 5, 3));
  auto flat = (*idx_source::make(set, true))->shape();
  CHECK(flat.input == std::vector<int64_t>{36});
  CHECK(flat.classes == 5);
  CHECK((*idx_source::make(set, false))->shape().input == std::vector<int64_t>{1, 6, 6});
  auto text = (*text_source::make(counting_corpus(), text_source_options{8, 0}))->shape();
  CHECK(text.input == std::vector<int64_t>{8});
  CHECK(text.classes == 256);

  data_source_options o;
  o.kind = "idx";
  o.idx.dir = "/nonexistent";
  o.idx.synthetic_when_absent = true;
  o.idx.max_items = 50;
  auto images = make_data_split(o);
  REQUIRE_MESSAGE(images.ok(), (images.ok() ? "" : images.error().what));
  CHECK(images->train->size() == 50);
  REQUIRE(images->eval);
  CHECK(images->eval->size() == 10000); // the test split, every image
  CHECK(images->eval->shape().input == std::vector<int64_t>{784});
  CHECK(images->eval->shape().classes == 10);

  scratch_dir dir;
  REQUIRE(
      write_token_file(dir.file("t.bin"), std::vector<uint32_t>(64, 7), token_dtype::uint16).ok());
  REQUIRE(
      write_token_file(dir.file("v.bin"), std::vector<uint32_t>(15, 3), token_dtype::uint16).ok());
  o.kind = "tokens";
  o.tokens.file.path = dir.file("t.bin");
  fit_to_model(o, 7, 8);
  auto tokens = make_data_split(o);
  REQUIRE(tokens.ok());
  CHECK(tokens->train->shape().input == std::vector<int64_t>{7});
  CHECK(tokens->train->shape().classes == 8);
  CHECK_FALSE(tokens->eval); // no eval_path: no held-out source
  auto before = cache_key(o);
  o.eval_path = dir.file("v.bin");
  CHECK(cache_key(o) != before);
  tokens = make_data_split(o);
  REQUIRE(tokens.ok());
  REQUIRE(tokens->eval);
  CHECK(tokens->eval->size() == 2); // windows of 8 every 7 in 15 tokens
  o.eval_path = dir.file("absent.bin");
  CHECK_FALSE(make_data_split(o).ok());
}

TEST_CASE("a loader's ids through a source give every window once per epoch") {
  auto s = text_source::make(counting_corpus(), text_source_options{8, 0});
  REQUIRE(s.ok());
  auto l = sample_loader::make((*s)->size(), loader_options{1, 1, 0, shard_layout::scattered});
  REQUIRE(l.ok());
  std::vector<int64_t> starts;
  for (int i = 0; i < 23; ++i) {
    auto b = (*s)->batch(l->next(1));
    REQUIRE(b.ok());
    starts.push_back(b->inputs[0][0].item<int64_t>());
  }
  std::sort(starts.begin(), starts.end());
  for (int64_t i = 0; i < 23; ++i)
    CHECK(starts[i] == 8 * i);
}

} // namespace starling::test::kernels_data_source_test
