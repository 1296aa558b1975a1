// examples/torchscript: a GPT written in PyTorch (prepare.py, run by /usr/bin/python3 at test
// time) trained by SWARM from its TorchScript stage files with a preempted stage peer; the
// exported weights reload in Python (check.py) with the held-out loss starling reported. And the
// errors of a bad model or token file: one line, a non-zero exit.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <unistd.h>

#include "kernels/data/token_file.hpp"
#include "support/python_fixtures.hpp"
#include "support/node_fixtures.hpp"
#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_torchscript_swarm_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string example = STARLING_SOURCE_DIR + "/examples/torchscript";

/// A fresh run folder (the shared fixture's, removed when the test ends).
struct run_dir : starling::testing::temp_dir {
  run_dir() : starling::testing::temp_dir("starling-tsrun") {}
};

/// The example's files for a small model, written by prepare.py once per build.
std::string prepared() {
  return starling::testing::python_fixtures(
    example + "/prepare.py",
    {"--layers", "2", "--width", "32", "--heads", "2", "--seq-len", "32", "--train-bytes", "60000",
     "--val-bytes", "8000"},
    {example + "/prepare.py", example + "/model.py"});
}

/// The example's swarm.yaml on the files of `dir`, shortened; `faults` appended.
std::vector<std::string> swarm_args(const std::string& dir, const std::string& yaml,
                                    std::vector<std::string> extra) {
  std::vector<std::string> a{STARLING_BINARY,
                             "run",
                             yaml,
                             "--set",
                             "swarm.model.files[0]=" + dir + "/stage0.pt",
                             "--set",
                             "swarm.model.files[1]=" + dir + "/stage1.pt",
                             "--set",
                             "swarm.model.seq_len=32",
                             "--set",
                             "swarm.data.path=" + dir + "/train.bin",
                             "--set",
                             "swarm.data.eval_path=" + dir + "/val.bin",
                             "--set",
                             "swarm.microbatch=8",
                             "--set",
                             "swarm.microbatches_per_trainer=60",
                             "--set",
                             "swarm.target_batch=32",
                             "--set",
                             "swarm.preempt_every=0s",
                             "--set",
                             "swarm.eval_batches=2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

} // namespace

TEST_CASE("a TorchScript GPT trains with SWARM through a preemption and its exported weights "
          "give the same held-out loss in Python") {
  auto dir = prepared();
  run_dir scratch;
  auto out = scratch.path;
  auto yaml = out + "/swarm.yaml";
  {
    std::ifstream in{example + "/swarm.yaml"};
    std::ofstream out{yaml};
    // Early in the run, so that the restart (and its state download) comes well before the end
    // even when the run is fast: 960 samples took 4.0 s here.
    out << in.rdbuf() << "faults:\n  - {kill: peers, instance: 1, at: 1s, restart_after: 500ms}\n";
  }
  subprocess p{swarm_args(dir, yaml, {"--out", out + "/run"})};
  auto held_out = p.wait_for("held-out loss (before -> after)", 150s);
  REQUIRE_MESSAGE(held_out, p.output());
  std::smatch m;
  REQUIRE(std::regex_search(*held_out, m, std::regex{R"(([0-9.]+) -> ([0-9.]+))"}));
  CHECK(std::stod(m[2]) < std::stod(m[1]) - 0.3);
  CHECK(p.output().find("960 of 960 requested") != std::string::npos);
  CHECK(p.output().find("preemptions                        1 (1 restarts") != std::string::npos);
  CHECK(p.wait_exit(60s) == 0);
  CHECK(p.output().find("export                             4 files") != std::string::npos);
  subprocess check{{"/usr/bin/python3", example + "/check.py", out + "/run/export", dir}};
  CHECK(check.wait_exit(120s) == 0);
  INFO(check.output());
  CHECK(check.output().find("match") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("a bad TorchScript model or token file is one error line and a non-zero exit") {
  auto dir = prepared();
  run_dir scratch;
  auto out = scratch.path;
  auto yaml = example + "/swarm.yaml";
  auto error_line = [&](std::vector<std::string> extra) {
    subprocess p{swarm_args(dir, yaml, std::move(extra))};
    auto rc = p.wait_exit(60s);
    CHECK(rc == 2);
    auto out = p.output();
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    return out;
  };
  auto missing = error_line({"--set", "swarm.model.files[1]=" + dir + "/nowhere.pt"});
  CHECK(missing.find("swarm.model: " + dir + "/nowhere.pt: no such file") != std::string::npos);
  auto swapped = error_line({"--set", "swarm.model.files[0]=" + dir + "/stage1.pt", "--set",
                             "swarm.model.files[1]=" + dir + "/stage0.pt"});
  CHECK(swapped.find(dir + "/stage1.pt: does not accept the model's input") != std::string::npos);
  auto unknown = error_line({"--set", "swarm.model.width=64"});
  CHECK(unknown.find("width") != std::string::npos);
  REQUIRE(starling::kernels::write_token_file(out + "/oov.bin", {1, 2, 300, 4},
                                              starling::kernels::token_dtype::uint16));
  auto oov = error_line({"--set", "swarm.data.path=" + out + "/oov.bin"});
  CHECK(oov.find("oov.bin") != std::string::npos);
  CHECK(oov.find("300") != std::string::npos);
  fs::remove_all(out);
}

} // namespace starling::test::runtime_torchscript_swarm_test
