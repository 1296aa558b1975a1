// The text-to-image demo's keys of the `dedloc` kind: `model: {kind: gpt, ...}` and `demo:`, and
// configs/volunteers-t2i.yaml.
#include <doctest/doctest.h>

#include <string>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/yaml.hpp"
#include "runtime/run/dedloc.hpp"
#include "runtime/run/kinds.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_t2i_config_test {

using namespace starling::runtime;

namespace {

/// Reads a 2-peer dedloc section with `body`: the peers' options, or the error's message.
std::pair<std::optional<dedloc_role_options>, std::string> read_t2i(const std::string& body) {
  try {
    auto cfg = read_experiment(
        load_yaml_string("experiment: {name: x, kind: dedloc}\ndedloc:\n  peers: 2\n" + body,
                         "x.yaml"),
        builtin_registry(), {});
    REQUIRE(cfg.graph.find("peers"));
    return {std::any_cast<const dedloc_role_options&>(cfg.graph.find("peers")->options), ""};
  } catch (const config_error& e) {
    return {std::nullopt, e.what()};
  }
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("model kind gpt sets the GPT and the codebook; its sizes come from the codebook") {
  auto [o, err] = read_t2i("  model: {kind: gpt, layers: 3, width: 48, heads: 3, codes: 300,\n"
                           "          codebook_images: 500, codebook_iterations: 7,\n"
                           "          codebook_seed: 5}\n"
                           "  train_samples: 1000\n"
                           "  eval_samples: 200\n"
                           "  demo: {grid_samples: 4, quality_samples: 10, temperature: 0.8,\n"
                           "         top_k: 50, test_images: 300, classifier_epochs: 2}\n");
  REQUIRE_MESSAGE(o, err);
  REQUIRE(o->gpt);
  REQUIRE(o->t2i);
  CHECK(o->gpt->layers == 3);
  CHECK(o->gpt->width == 48);
  CHECK(o->gpt->heads == 3);
  CHECK(o->t2i->codebook.codes == 300);
  CHECK(o->t2i->codebook.max_images == 500);
  CHECK(o->t2i->codebook.max_iterations == 7);
  CHECK(o->t2i->codebook.seed == 5);
  CHECK(o->t2i->images.max_items == 1000);
  CHECK(o->t2i->eval_images == 300); // the larger of eval_samples and demo.test_images
  auto layout = t2i_layout_of(*o->t2i);
  CHECK(layout.image_tokens == 49);
  CHECK(o->gpt->vocab == layout.vocab());
  CHECK(o->gpt->seq_len == layout.sequence_length() - 1);
  CHECK(o->demo.grid_samples == 4);
  CHECK(o->demo.quality_samples == 10);
  CHECK(o->demo.temperature == doctest::Approx(0.8));
  CHECK(o->demo.top_k == 50);
  CHECK(o->demo.classifier.epochs == 2);
}

TEST_CASE("the demo's keys are checked with clear errors") {
  auto error_of = [](const std::string& body) { return read_t2i(body).second; };
  CHECK(has(error_of("  model: {kind: gpt, width: 50, heads: 4}\n"), "must divide width"));
  CHECK(has(error_of("  model: {kind: gpt, patch: 5}\n"), "must divide 28"));
  CHECK(has(error_of("  model: {kind: gpt, codes: 1}\n"), "2..4096 codes"));
  CHECK(has(error_of("  model: {kind: gpt, codebook_digest: xyz}\n"), "64 lowercase hex"));
  CHECK(has(error_of("  model: {kind: gpt, colours: 3}\n"), "colours"));
  CHECK(has(error_of("  demo: {grid_samples: 4}\n"), "model: {kind: gpt"));
  CHECK(has(error_of("  model: {kind: gpt}\n  demo: {grid_samples: 65}\n"), "grid_samples"));
  CHECK(has(error_of("  model: {kind: gpt}\n  demo: {temperature: -1}\n"), "temperature"));
  CHECK(has(error_of("  model: {kind: gpt}\n  backend: modeled\n"), "backend: torch"));
  CHECK(has(error_of("  torch_threads: -1\n"), "torch_threads"));
  CHECK(has(error_of("  model: {kind: gpt}\n  data: {kind: tokens, path: /x}\n"),
            "captioned Fashion-MNIST"));
}

TEST_CASE("configs/volunteers-t2i.yaml reads: a GPT over a 256-code codebook, open volunteer "
          "slots") {
  auto cfg = load_experiment_file(STARLING_SOURCE_DIR + "/configs/volunteers-t2i.yaml",
                                  builtin_registry(), {});
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().what));
  auto& g = cfg->graph;
  REQUIRE(g.find("peers"));
  REQUIRE(g.find("volunteers"));
  CHECK(g.find("volunteers")->placement.open);
  auto& o = std::any_cast<const dedloc_role_options&>(g.find("peers")->options);
  REQUIRE(o.gpt);
  REQUIRE(o.t2i);
  CHECK(o.t2i->codebook.codes >= 256);
  CHECK(o.t2i->codebook.codes <= 512);
  CHECK(o.demo.grid_samples == 8);
  CHECK(o.torch_threads == 1);
  CHECK(o.t2i->codebook_digest.size() == 64);
}

} // namespace starling::test::runtime_t2i_config_test
