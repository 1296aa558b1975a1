#include "kernels/t2i/captions.hpp"

#include <doctest/doctest.h>

#include <set>

namespace starling::test::kernels_t2i_captions_test {

using namespace starling::kernels;

TEST_CASE("every class has its phrasings, all within the caption vocabulary") {
  t2i_layout layout{256, 49};
  CHECK(*caption_for(9, 0) == "a photo of an ankle boot");
  CHECK(*caption_for(9, 3) == "an ankle boot");
  CHECK(*caption_for(1, 1) == "a picture of a pair of trousers");
  CHECK_FALSE(caption_for(10, 0).ok());
  std::set<std::string> all;
  for (std::size_t c = 0; c < caption_classes; ++c)
    for (std::size_t p = 0; p < caption_phrasings; ++p) {
      auto text = caption_for(c, p);
      REQUIRE(text.ok());
      all.insert(*text);
      auto tokens = caption_to_tokens(layout, *text);
      REQUIRE_MESSAGE(tokens.ok(), *text);
      CHECK(tokens->size() == caption_tokens);
      for (auto t : *tokens)
        CHECK((t >= layout.padding() && t < layout.vocab()));
    }
  CHECK(all.size() == caption_classes * caption_phrasings);
  CHECK(layout.vocab() == 256 + 2 + static_cast<int64_t>(caption_words().size()));
  CHECK(layout.sequence_length() == 8 + 1 + 49);
}

TEST_CASE("the phrasing of a sample depends on the seed and the sample only") {
  std::set<std::size_t> seen;
  for (uint64_t s = 0; s < 64; ++s) {
    auto p = phrasing_for(7, s);
    CHECK(p < caption_phrasings);
    CHECK(p == phrasing_for(7, s));
    seen.insert(p);
  }
  CHECK(seen.size() == caption_phrasings);
}

TEST_CASE("the joint sequence is [caption | separator | image] and refuses bad parts") {
  t2i_layout layout{16, 4};
  auto seq = joint_sequence(layout, "a bag", {3, 0, 15, 7});
  REQUIRE(seq.ok());
  REQUIRE(seq->size() == static_cast<std::size_t>(layout.sequence_length()));
  CHECK((*seq)[2] == layout.padding());
  CHECK((*seq)[caption_tokens] == layout.separator());
  CHECK(std::vector<int64_t>(seq->begin() + layout.prompt_length(), seq->end()) ==
        std::vector<int64_t>{3, 0, 15, 7});
  // Different captions, different tokens.
  CHECK(*caption_to_tokens(layout, "a bag") != *caption_to_tokens(layout, "a coat"));
  CHECK_FALSE(joint_sequence(layout, "a bag", {3, 0, 16, 7}).ok());
  CHECK_FALSE(joint_sequence(layout, "a bag", {3, 0}).ok());
  CHECK_FALSE(caption_to_tokens(layout, "a photo of a zebra").ok());
  CHECK_FALSE(caption_to_tokens(layout, "").ok());
  CHECK_FALSE(caption_to_tokens(layout, "a a a a a a a a a").ok());
}

} // namespace starling::test::kernels_t2i_captions_test
