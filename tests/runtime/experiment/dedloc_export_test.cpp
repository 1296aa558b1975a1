// `dedloc.export: true`: the final model of a data-parallel run back to PyTorch. The TorchScript
// GPT of examples/torchscript trained by a short local-mode collaboration reloads in Python
// (examples/torchscript/check.py, run by /usr/bin/python3) with the held-out loss starling wrote;
// a simulated run of the built-in MLP exports a state dict with the model's parameter names and
// shapes, whose values give export.json's held-out loss. In that run the two client-mode peers'
// nodes accept no connection (`network.firewalled`): nobody dials them, and their partners
// credit their samples.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "kernels/data/idx_source.hpp"
#include "kernels/models/mlp.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/models/torchscript.hpp"
#include "support/node_fixtures.hpp"
#include "support/python_fixtures.hpp"
#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_dedloc_export_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string example = STARLING_SOURCE_DIR + "/examples/torchscript";

template <class T>
T must(starling::result<T> r) {
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  return std::move(r).value();
}

/// The example's files for a small model (the same as torchscript_swarm_test's, so shared).
std::string prepared() {
  return starling::testing::python_fixtures(example + "/prepare.py",
                                            {"--layers", "2", "--width", "32", "--heads", "2",
                                             "--seq-len", "32", "--train-bytes", "60000",
                                             "--val-bytes", "8000"},
                                            {example + "/prepare.py", example + "/model.py"});
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in{path};
  REQUIRE_MESSAGE(in, "cannot read " << path);
  return nlohmann::json::parse(in);
}

/// `starling run` with `args`, each of `sets` as `--set key=value`, to its exit; the output,
/// checked for exit code 0.
std::string run_to_end(std::vector<std::string> args,
                       const std::vector<std::pair<std::string, std::string>>& sets,
                       std::chrono::seconds limit) {
  args.insert(args.begin(), {STARLING_BINARY, "run"});
  for (auto& [key, value] : sets) {
    args.push_back("--set");
    args.push_back(key + "=" + value);
  }
  subprocess p{args};
  auto rc = p.wait_exit(limit);
  INFO(p.output());
  REQUIRE(rc);
  CHECK(*rc == 0);
  return p.output();
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a TorchScript GPT trained by a local dedloc run exports TorchScript and state dicts "
          "that give starling's held-out loss in Python") {
  auto dir = prepared();
  starling::testing::temp_dir scratch{"starling-dpexport"};
  auto out = scratch.path + "/run";
  auto text = run_to_end({example + "/dedloc.yaml", "--out", out},
                         {{"experiment.duration", "50s"},
                          {"dedloc.steps", "3"}, // ends the run: a loaded machine takes longer
                          {"dedloc.peers", "2"},
                          {"dedloc.churn", "0"},
                          {"dedloc.model.files[0]", dir + "/whole.pt"},
                          {"dedloc.model.seq_len", "32"},
                          {"dedloc.data.path", dir + "/train.bin"},
                          {"dedloc.data.eval_path", dir + "/val.bin"},
                          {"dedloc.target_batch", "16"},
                          {"dedloc.window", "200ms"},
                          {"dedloc.eval_samples", "24"},
                          {"dedloc.export", "true"}},
                         60s);
  CHECK(has(text, "export                             2 files in " + out + "/export"));
  auto ex = read_json(out + "/export/export.json");
  CHECK(ex["files"] ==
        nlohmann::json::array({out + "/export/whole.pt", out + "/export/whole.state_dict.pt"}));
  CHECK(ex["step"].get<uint64_t>() >= 1);
  CHECK(ex["held_out_samples"] == 24);
  CHECK(ex["seq_len"] == 32);
  // The collaboration trained: the exported parameters are not the prepared ones.
  CHECK(ex["held_out_loss"].get<double>() < ex["held_out_loss_before"].get<double>());
  // check.py: torch.jit.load of whole.pt, and the state dict loaded (torch.load) both into the
  // prepared (untrained) TorchScript file and into a fresh model.py module, each evaluated on the
  // first 24 windows of val.bin against export.json's loss (1e-4).
  subprocess check{{"/usr/bin/python3", example + "/check.py", out + "/export", dir}};
  auto rc = check.wait_exit(120s);
  INFO(check.output());
  CHECK(rc == 0);
  CHECK(has(check.output(), "match"));
  CHECK_FALSE(has(check.output(), "MISMATCH"));
}

TEST_CASE("a scripted CNN trained on Fashion-MNIST by a local dedloc run exports TorchScript "
          "that gives starling's held-out loss in Python") {
  // examples/torchscript/dedloc-cnn.yaml as it is, with the fixture's small CNN.
  auto dir = starling::testing::python_fixtures(example + "/image_model.py",
                                                {"--channels", "4", "--seed", "1"},
                                                {example + "/image_model.py"});
  starling::testing::temp_dir scratch{"starling-cnnexport"};
  auto out = scratch.path + "/run";
  auto text = run_to_end({example + "/dedloc-cnn.yaml", "--out", out},
                         {{"experiment.duration", "50s"},
                          {"dedloc.steps", "3"}, // ends the run: a loaded machine takes longer
                          {"dedloc.peers", "2"},
                          {"dedloc.churn", "0"},
                          {"dedloc.model.files[0]", dir + "/cnn.pt"},
                          {"dedloc.target_batch", "64"},
                          {"dedloc.window", "200ms"},
                          {"dedloc.eval_samples", "200"}},
                         60s);
  CHECK(has(text, "export                             2 files in " + out + "/export"));
  auto ex = read_json(out + "/export/export.json");
  CHECK(ex["files"] ==
        nlohmann::json::array({out + "/export/cnn.pt", out + "/export/cnn.state_dict.pt"}));
  CHECK(ex["input_shape"] == nlohmann::json::array({1, 28, 28}));
  CHECK_FALSE(ex.contains("seq_len"));
  CHECK(ex["held_out_samples"] == 200);
  CHECK(ex["held_out_loss"].get<double>() < ex["held_out_loss_before"].get<double>());
  // check_images.py: the exported TorchScript file and its state dict on the first 200 test
  // images of Fashion-MNIST (install-deps installs it) against export.json's loss (1e-4).
  subprocess check{{"/usr/bin/python3", example + "/check_images.py", out + "/export"}};
  auto rc = check.wait_exit(120s);
  INFO(check.output());
  CHECK(rc == 0);
  CHECK(has(check.output(), "match"));
  CHECK_FALSE(has(check.output(), "MISMATCH"));
}

TEST_CASE("a simulated dedloc run of the built-in MLP exports a state dict with the model's names "
          "and shapes that gives export.json's held-out loss") {
  starling::testing::temp_dir scratch{"starling-dpexport"};
  auto out = scratch.path + "/run";
  // Three peers, the last two on nodes that accept no connection: they run in client mode by
  // themselves (the plan says full mode: `clients: 0`), and the export takes the full-mode
  // peer's state.
  // The file as it is, its network section told that nodes 1 and 2 accept no connection.
  auto config = scratch.path + "/dedloc-fmnist.yaml";
  {
    std::ifstream in{STARLING_SOURCE_DIR + "/configs/dedloc-fmnist.yaml"};
    std::ofstream f{config};
    std::string line;
    bool put = false;
    while (std::getline(in, line)) {
      f << line << "\n";
      if (line.rfind("network:", 0) == 0) {
        f << "  firewalled: [node1, node2]\n";
        put = true;
      }
    }
    REQUIRE(put);
  }
  auto text = run_to_end({"--sim", config, "--out", out},
                         {{"experiment.duration", "20s"},
                          {"experiment.nodes", "3"},
                          {"dedloc.peers", "3"},
                          {"dedloc.clients", "0"},
                          {"dedloc.churn", "0"},
                          {"dedloc.data_dir", "/nonexistent/fashion-mnist"},
                          {"dedloc.synthetic", "true"},
                          {"dedloc.train_samples", "2048"},
                          {"dedloc.width", "32"},
                          {"dedloc.microbatch", "16"},
                          {"dedloc.target_batch", "64"},
                          {"dedloc.compute_time", "100ms"},
                          {"dedloc.eval_every", "0"},
                          {"dedloc.eval_samples", "300"},
                          {"dedloc.export", "true"}},
                         120s);
  CHECK(has(text, "export                             1 file in " + out + "/export"));
  CHECK(has(text, "3 starts, 2 in client mode"));
  // Client mode never needs to be dialled: no message was sent to them unasked.
  CHECK(has(text, "unsolicited messages to firewalled 0 (dropped: node1, node2 accept no "
                  "connection)"));
  {
    std::ifstream ledger{out + "/ledger.csv"};
    std::string line;
    int credited = 0;
    while (std::getline(ledger, line)) {
      if (line.rfind("peers.1,", 0) != 0 && line.rfind("peers.2,", 0) != 0)
        continue;
      // peer,peer_id,samples_computed,samples_accepted,...
      std::vector<std::string> f;
      std::istringstream cells{line};
      std::string cell;
      while (f.size() < 4 && std::getline(cells, cell, ','))
        f.push_back(cell);
      if (f.size() == 4 && std::stod(f[3]) > 0)
        ++credited;
    }
    CHECK_MESSAGE(credited == 2, "client-mode peers credited by their partners");
  }
  auto ex = read_json(out + "/export/export.json");
  auto sd_file = out + "/export/stage0.state_dict.pt";
  CHECK(ex["files"] == nlohmann::json::array({sd_file}));
  CHECK(ex["step"].get<uint64_t>() >= 3);
  CHECK(ex["held_out_samples"] == 300);
  auto sd = must(starling::kernels::load_state_dict(sd_file));

  // The run's MLP (784-32-10, seeded by experiment.seed 42) as every peer started.
  starling::kernels::mlp_config cfg;
  cfg.inputs = 784;
  cfg.width = 32;
  cfg.layers = 1;
  cfg.classes = 10;
  cfg.seed = 42;
  auto model = must(starling::kernels::make_mlp(cfg));
  auto params = model->named_parameters(true);
  REQUIRE(sd.size() == params.size());
  bool trained = false;
  {
    torch::NoGradGuard guard;
    for (size_t i = 0; i < sd.size(); ++i) {
      auto& [name, t] = sd[i];
      CAPTURE(name);
      CHECK(name == params[i].key());
      CHECK(t.sizes() == params[i].value().sizes());
      trained = trained || !t.equal(params[i].value());
      params[i].value().copy_(t);
    }
  }
  CHECK(trained);

  // The held-out loss of the exported values on the first 300 test images of the stand-in.
  starling::kernels::idx_source_options io;
  io.dir = "/nonexistent/fashion-mnist";
  io.train = false;
  io.synthetic_when_absent = true;
  auto test = must(starling::kernels::idx_source::load(io));
  std::vector<uint64_t> ids(300);
  for (uint64_t i = 0; i < ids.size(); ++i)
    ids[i] = i;
  auto b = must(test->batch(ids));
  torch::NoGradGuard guard;
  model->eval();
  auto loss = model->loss(model->predict(b.inputs), b.targets).item<double>();
  CHECK(loss == doctest::Approx(ex["held_out_loss"].get<double>()).epsilon(1e-5));
  CHECK(loss < ex["held_out_loss_before"].get<double>());
}

} // namespace starling::test::runtime_dedloc_export_test
