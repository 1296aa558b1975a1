// The text-to-image demo reduced to a test: `starling run` of a local dedloc collaboration of two
// peers training a tiny GPT (`model.kind: gpt`) on captioned Fashion-MNIST tokens for 100
// global steps; at the end the run's folder holds grid.png (a row per caption, 8 samples each,
// read back with libpng) and quality.json (the classifier's accuracy on real test images, on
// their codebook reconstructions and on the generated images).
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/t2i/png.hpp"
#include "support/paths.hpp"
#include "support/scratch.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_t2i_demo_test {

using namespace std::chrono_literals;

TEST_CASE("a local text-to-image run writes a grid of 8 samples per caption and quality above "
          "chance for the codebook's reconstructions and the generated images") {
  testing::scratch dir{"starling-t2i-demo"};
  auto yaml = (dir.path / "t2i.yaml").string();
  std::ofstream{yaml}
      << "experiment: {name: t2i-test, kind: dedloc, seed: 3, mode: local, duration: 60s}\n"
         "caf: {scheduler: {policy: sharing, max_threads: 2}}\n"
         "dedloc:\n"
         "  peers: 2\n"
         "  steps: 100\n"
         "  model: {kind: gpt, layers: 1, width: 32, heads: 2, codes: 64,\n"
         "          codebook_images: 300, codebook_iterations: 6}\n"
         "  train_samples: 3000\n"
         "  torch_threads: 1\n"
         "  synthetic: true\n"
         "  optimizer: adam\n"
         "  lr: 0.005\n"
         "  max_grad_norm: 1.0\n"
         "  microbatch: 16\n"
         "  target_batch: 64\n"
         "  compute_time: 20ms\n"
         "  window: 300ms\n"
         "  averager_timeout: 3s\n"
         "  round_timeout: 5s\n"
         "  record_lifetime: 5s\n"
         "  eval_every: 0\n"
         "  eval_samples: 0\n"
         "  demo: {grid_samples: 8, quality_samples: 16, test_images: 300, classifier_epochs: 2}\n";
  auto out = dir.path / "out";
  testing::subprocess run{{STARLING_BINARY, "run", yaml, "--out", out.string()}};
  auto rc = run.wait_exit(120s);
  while (run.read_line(0ms)) {
  }
  INFO(run.output());
  REQUIRE(rc);
  REQUIRE(*rc == 0);
  CHECK(run.output().find("codebook of 64 codes") != std::string::npos);

  // grid.png: a PNG (its signature) of 10 rows and 8 columns of 28x28 images, 2 pixels apart.
  auto grid_path = (out / "grid.png").string();
  std::ifstream raw{grid_path, std::ios::binary};
  REQUIRE(raw);
  char signature[8] = {};
  raw.read(signature, 8);
  CHECK(std::string(signature, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  auto grid = kernels::read_png_gray(grid_path);
  REQUIRE_MESSAGE(grid.ok(), (grid.ok() ? "" : grid.error().what));
  CHECK(grid->width == 8 * 28 + 9 * 2);
  CHECK(grid->height == 10 * 28 + 11 * 2);
  // The samples are not blank: some pixels of the first image are lit.
  int lit = 0;
  for (std::size_t y = 2; y < 30; ++y)
    for (std::size_t x = 2; x < 30; ++x)
      lit += grid->pixels[y * grid->width + x] > 0 ? 1 : 0;
  CHECK(lit > 0);

  // quality.json: three accuracies, all above chance (10%): real images and the codebook's
  // reconstructions well above; the generated images of a 100-step model (a 1-layer GPT of width
  // 32) measured 0.26-0.34 here, so above chance with a margin.
  std::ifstream qf{out / "quality.json"};
  REQUIRE(qf);
  auto q = nlohmann::json::parse(qf);
  auto& acc = q.at("classifier_accuracy");
  auto real = acc.at("real").get<double>();
  auto recon = acc.at("reconstruction").get<double>();
  auto generated = acc.at("generated").get<double>();
  MESSAGE("classifier accuracy: real " << real << ", reconstructions " << recon << ", generated "
                                       << generated);
  CHECK(real > 0.5);
  CHECK(recon > 0.3);
  CHECK(generated > 0.1);
  CHECK(generated <= 1.0);
  CHECK(q.at("per_caption").size() == 10);
  CHECK(q.at("test_images").get<int>() == 300);
  CHECK(q.at("codebook_digest").get<std::string>().size() == 64);
}

TEST_CASE("SIGINT while a node still starts its roles (a codebook fit) ends the node cleanly") {
  // The supervisor spawns a t2i peer inside a handler that fits the codebook for seconds; a
  // SIGINT then shut the node down under it, and the handler's next use of the node (its
  // averager's spawn) found the actor system already gone: SIGSEGV, every time. The node now
  // waits for its actors before it takes anything down.
  testing::scratch dir{"starling-t2i-sigint"};
  auto yaml = (dir.path / "t2i.yaml").string();
  std::ofstream{yaml}
      << "experiment: {name: t2i-sigint, kind: dedloc, seed: 3, duration: 60s}\n"
         "caf: {scheduler: {policy: sharing, max_threads: 2}}\n"
         "dedloc:\n"
         "  peers: 1\n"
         "  model: {kind: gpt, layers: 1, width: 32, heads: 2, codes: 256,\n"
         "          codebook_images: 150, codebook_iterations: 12}\n"
         "  train_samples: 3000\n"
         "  torch_threads: 1\n"
         "  synthetic: true\n"
         "  eval_every: 0\n"
         "  eval_samples: 0\n";
  testing::subprocess node{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", yaml,
                            "--index", "0", "--nodes", "1", "--out", (dir.path / "n0").string()}};
  // The line before the roles start; the fit takes seconds after it.
  REQUIRE_MESSAGE(node.wait_for("node0 of 1:", 60s), node.output());
  node.signal(SIGINT);
  auto rc = node.wait_exit(60s);
  while (node.read_line(0ms)) {
  }
  INFO(node.output());
  REQUIRE(rc);
  CHECK(*rc < 128); // not killed by a signal
  CHECK(node.output().find("shutting down") != std::string::npos);
}

} // namespace starling::test::runtime_t2i_demo_test
