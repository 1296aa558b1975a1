#include "kernels/t2i/captions.hpp"

#include <algorithm>
#include <array>
#include <sstream>

#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

namespace {

const std::array<const char*, caption_classes> nouns = {
    "a t-shirt", "a pair of trousers", "a pullover", "a dress",      "a coat", "a sandal",
    "a shirt",   "a sneaker",          "a bag",      "an ankle boot"};

const std::array<const char*, caption_phrasings> phrasings = {"a photo of ", "a picture of ",
                                                              "an image of ", ""};

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

} // namespace

std::string class_noun(std::size_t label) {
  return label < nouns.size() ? nouns[label] : std::string{};
}

result<std::string> caption_for(std::size_t label, std::size_t phrasing) {
  if (label >= caption_classes)
    return fail("no caption for class " + std::to_string(label) + ", expected a class below " +
                std::to_string(caption_classes));
  return std::string{phrasings[phrasing % caption_phrasings]} + nouns[label];
}

std::size_t phrasing_for(uint64_t seed, uint64_t sample) {
  return static_cast<std::size_t>(splitmix64_combine(seed, sample, 0xca9) % caption_phrasings);
}

const std::vector<std::string>& caption_words() {
  // Derived once from the constant phrasings and nouns; sorted, so the order is fixed.
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w;
    for (auto p : phrasings)
      for (auto& s : split_words(p))
        w.push_back(s);
    for (auto n : nouns)
      for (auto& s : split_words(n))
        w.push_back(s);
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
    return w;
  }();
  return words;
}

int64_t t2i_layout::vocab() const noexcept {
  return codes + 2 + static_cast<int64_t>(caption_words().size());
}

result<std::vector<int64_t>> caption_to_tokens(const t2i_layout& layout, const std::string& text) {
  auto words = split_words(text);
  if (words.empty() || words.size() > caption_tokens)
    return fail("a caption needs 1 to " + std::to_string(caption_tokens) + " words, got " +
                std::to_string(words.size()) + " in \"" + text + "\"");
  const auto& vocab = caption_words();
  std::vector<int64_t> out;
  for (auto& w : words) {
    auto it = std::lower_bound(vocab.begin(), vocab.end(), w);
    if (it == vocab.end() || *it != w)
      return fail("caption word \"" + w + "\" is not in the demo's vocabulary");
    out.push_back(layout.word(static_cast<std::size_t>(it - vocab.begin())));
  }
  out.resize(caption_tokens, layout.padding());
  return out;
}

result<std::vector<int64_t>> prompt_tokens(const t2i_layout& layout, const std::string& caption) {
  auto t = caption_to_tokens(layout, caption);
  if (!t)
    return t;
  t->push_back(layout.separator());
  return t;
}

result<std::vector<int64_t>> joint_sequence(const t2i_layout& layout, const std::string& caption,
                                            const std::vector<int64_t>& image_tokens) {
  if (static_cast<int64_t>(image_tokens.size()) != layout.image_tokens)
    return fail("expected " + std::to_string(layout.image_tokens) + " image tokens, got " +
                std::to_string(image_tokens.size()));
  for (auto t : image_tokens)
    if (t < 0 || t >= layout.codes)
      return fail("image token " + std::to_string(t) + " is outside [0, " +
                  std::to_string(layout.codes) + ")");
  auto seq = prompt_tokens(layout, caption);
  if (!seq)
    return seq;
  seq->insert(seq->end(), image_tokens.begin(), image_tokens.end());
  return seq;
}

} // namespace starling::kernels
