#include "kernels/data/corpus.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <set>
#include "support/paths.hpp"

namespace starling::test::kernels_corpus_test {

using namespace starling::kernels;

namespace {

corpus_options fallback_only() {
  corpus_options o;
  o.bible_command = "/nonexistent/bible -f \"Gen1:1-Rev22:21\" 2>/dev/null";
  o.fallback_dir = STARLING_SOURCE_DIR + "/examples/data";
  return o;
}

corpus small_corpus() {
  std::string text;
  for (int i = 0; i < 4000; ++i)
    text += static_cast<char>('a' + i % 26);
  return corpus(text, 0.05, "test");
}

/// Start positions of sampled windows, recovered by finding each window's bytes in the corpus.
std::set<int64_t> sampled_starts(const corpus& c, const text_sampler& s, std::mt19937_64& gen,
                                 int rounds) {
  std::set<int64_t> starts;
  for (int r = 0; r < rounds; ++r) {
    auto b = s.sample(gen);
    auto x = b.inputs.accessor<int64_t, 2>();
    auto y = b.targets.accessor<int64_t, 2>();
    for (int64_t i = 0; i < b.inputs.size(0); ++i) {
      // Find the start: the unique position whose next seq_len+1 bytes match.
      auto& t = c.text();
      std::string w;
      for (int64_t j = 0; j < b.inputs.size(1); ++j)
        w += static_cast<char>(x[i][j]);
      w += static_cast<char>(y[i][b.inputs.size(1) - 1]);
      auto pos = t.find(w);
      REQUIRE(pos != std::string::npos);
      REQUIRE(t.find(w, pos + 1) == std::string::npos);
      starts.insert(static_cast<int64_t>(pos));
    }
  }
  return starts;
}

/// Seeded random bytes: every 17-byte window is unique (the test checks it), so a window's start
/// can be recovered from its content.
corpus unique_windows_corpus(int64_t n, double held_out) {
  std::mt19937_64 gen(2024);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text;
  for (int64_t i = 0; i < n; ++i)
    text += static_cast<char>(byte(gen));
  return corpus(text, held_out, "test");
}

} // namespace

TEST_CASE("verse references are stripped from every line") {
  auto text = strip_verse_prefixes("Ge1:1 In the beginning God.\n1Cor13:4 Charity suffereth long."
                                   "\nPsa23:1 The LORD is my shepherd.\nnot a ref: here\n");
  CHECK(text == "In the beginning God.\nCharity suffereth long.\nThe LORD is my shepherd.\n"
                "not a ref: here\n");
}

TEST_CASE("the Bible comes from the injected command with prefixes stripped") {
  corpus_options o = fallback_only();
  o.bible_command = "printf 'Ge1:1 In the beginning.\\nGe1:2 And the earth.\\n'";
  auto c = load_corpus(o);
  REQUIRE(c.ok());
  CHECK(c->source() == "bible");
  CHECK(c->text() == "In the beginning.\nAnd the earth.\n");
}

TEST_CASE("the shipped public-domain text is used when the bible command is absent") {
  auto c = load_corpus(fallback_only());
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().what));
  CHECK(c->source() != "bible");
  CHECK(c->size() > 15000);
  CHECK(c->text().find("Four score and seven years ago") != std::string::npos);
  CHECK(c->train_size() == c->size() - static_cast<int64_t>(c->size() * 0.05));
}

TEST_CASE("no command and no fallback text is a failure") {
  auto o = fallback_only();
  o.fallback_dir = "/nonexistent/dir";
  CHECK_FALSE(load_corpus(o).ok());
  o = fallback_only();
  o.held_out_fraction = 1.0;
  CHECK_FALSE(load_corpus(o).ok());
}

TEST_CASE("the installed King James Bible loads when present") {
  corpus_options o = fallback_only();
  o.bible_command = corpus_options{}.bible_command;
  auto c = load_corpus(o);
  REQUIRE(c.ok());
  if (c->source() != "bible") {
    MESSAGE("bible-kjv not installed: skipped");
    return;
  }
  CHECK(c->size() > 4000000);
  CHECK(c->text().rfind("In the beginning God created the heaven and the earth.", 0) == 0);
  CHECK(c->text().find("Ge1:") == std::string::npos);
}

TEST_CASE("the sampler is deterministic for a seed and targets are inputs shifted by one") {
  auto c = small_corpus();
  auto s = text_sampler::make(c, 0, 1, 8, 32);
  REQUIRE(s.ok());
  std::mt19937_64 g1(42), g2(42), g3(43);
  auto a = s->sample(g1), b = s->sample(g2), d = s->sample(g3);
  CHECK((a.inputs.sizes() == c10::IntArrayRef{8, 32}));
  CHECK((a.inputs.scalar_type() == torch::kLong));
  CHECK(torch::equal(a.inputs, b.inputs));
  CHECK(torch::equal(a.targets, b.targets));
  CHECK_FALSE(torch::equal(a.inputs, d.inputs));
  CHECK(torch::equal(a.inputs.narrow(1, 1, 31), a.targets.narrow(1, 0, 31)));
}

TEST_CASE("shards are disjoint and never reach the held-out tail") {
  auto c = unique_windows_corpus(6000, 0.05);
  const int64_t shards = 3, seq = 16;
  std::vector<std::pair<int64_t, int64_t>> used;
  for (int64_t k = 0; k < shards; ++k) {
    auto s = text_sampler::make(c, k, shards, 16, seq);
    REQUIRE(s.ok());
    std::mt19937_64 gen(k);
    auto starts = sampled_starts(c, *s, gen, 40);
    auto lo = *starts.begin(), hi = *starts.rbegin() + seq + 1; // bytes [lo, hi) read
    CHECK(lo >= s->range().first);
    CHECK(hi <= s->range().second);
    CHECK(hi <= c.train_size());
    used.emplace_back(lo, hi);
  }
  for (size_t i = 1; i < used.size(); ++i)
    CHECK(used[i - 1].second <= used[i].first);
}

TEST_CASE("held-out batches cover only the tail, in order") {
  auto c = unique_windows_corpus(6000, 0.05);
  auto batches = held_out_batches(c, 4, 16, 100);
  REQUIRE(batches.ok());
  int64_t windows = 0;
  for (auto& b : *batches)
    windows += b.inputs.size(0);
  CHECK(windows == (c.size() - c.train_size() - 1) / 16);
  auto first = static_cast<unsigned char>(c.text()[c.train_size()]);
  CHECK((*batches)[0].inputs[0][0].item<int64_t>() == first);
  CHECK(held_out_batches(c, 4, 16, 2)->size() == 2);
  CHECK_FALSE(held_out_batches(c, 4, 400, 2).ok());
}

TEST_CASE("invalid sampler arguments are failures") {
  auto c = small_corpus();
  CHECK_FALSE(text_sampler::make(c, 3, 3, 8, 32).ok());
  CHECK_FALSE(text_sampler::make(c, 0, 0, 8, 32).ok());
  CHECK_FALSE(text_sampler::make(c, 0, 1, 0, 32).ok());
  CHECK_FALSE(text_sampler::make(c, 0, 1000, 8, 32).ok()); // shards too small for a window
}

} // namespace starling::test::kernels_corpus_test
