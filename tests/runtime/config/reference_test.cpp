// configs/reference.yaml documents every key the readers ask for: every file under configs/
// and docs/guide/ is read in each mode with the key recorder on (runtime/config/asked_keys.hpp),
// and each key path asked for must be in the reference. The reference itself is read too, once
// per kind, so that a key it documents that no reader knows is an error.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "runtime/config/asked_keys.hpp"
#include "runtime/config/reader.hpp"
#include "runtime/experiment/yaml.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_reference_test {

using namespace starling::runtime;

namespace {

const std::string reference_path = STARLING_SOURCE_DIR + "/configs/reference.yaml";

/// Every `.yaml` file of `folder` (under the source tree) but the reference, sorted.
std::vector<std::string> yaml_files(const std::string& folder) {
  std::vector<std::string> out;
  for (auto& entry : std::filesystem::directory_iterator{STARLING_SOURCE_DIR + "/" + folder})
    if (entry.path().extension() == ".yaml" && entry.path().string() != reference_path)
      out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Reads `root` as `starling run`/`plan` do in `mode`; the error, empty when it reads.
std::string read_in(config_node root, const role_registry& registry, run_mode mode) {
  graph_load_options lo;
  lo.mode = mode;
  try {
    read_experiment(root, registry, lo);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

/// Every key path in the tree under `n` (found at `path`), normalized like the recorded ones.
void walk(const YAML::Node& n, const std::string& path, std::set<std::string>& out) {
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      auto sub = path.empty() ? it->first.Scalar() : path + "." + it->first.Scalar();
      out.insert(asked_keys::normalize(sub));
      walk(it->second, sub, out);
    }
  } else if (n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      walk(*it, path + "[]", out);
  }
}

/// The text of `path` with each alternative written as a comment (`<indent># key: value`)
/// uncommented, so that its keys count as documented.
std::string uncomment_alternatives(const std::string& path) {
  std::ifstream in{path};
  std::stringstream text;
  text << in.rdbuf();
  static const std::regex alternative{R"(^(\s*)# ([A-Za-z_][A-Za-z0-9_-]*): )"};
  std::string out;
  std::string line;
  while (std::getline(text, line))
    out += std::regex_replace(line, alternative, "$1$2: ") + "\n";
  return out;
}

constexpr run_mode all_modes[] = {run_mode::local, run_mode::sim, run_mode::cluster};

} // namespace

TEST_CASE("the reference documents every key the readers ask for") {
  auto registry = builtin_registry();
  asked_keys::start();
  size_t files = 0;
  for (auto folder : {"configs", "docs/guide"}) {
    for (auto& path : yaml_files(folder)) {
      ++files;
      // Each mode reads keys of its own (a swarm's `sim:` only in simulation); a file may refuse
      // a mode it is not written for (a fault kind it lacks), but reads in at least one.
      size_t read = 0;
      std::string errors;
      for (auto mode : all_modes) {
        auto err = read_in(load_yaml_file(path), registry, mode);
        if (err.empty())
          ++read;
        else
          errors += std::string{"\n  "} + to_string(mode) + ": " + err;
      }
      INFO(path, errors);
      CHECK(read > 0);
    }
  }
  CHECK(files >= 10);
  // Each kind's section of the reference, read as that kind's experiment in every mode, so that
  // its nested sections the example files leave out are asked for too, and every key it holds is
  // one a reader knows (an unknown key fails the read).
  auto reference = load_yaml_file(reference_path);
  for (auto& kind : registry.kind_names()) {
    auto tree = YAML::Clone(reference.raw());
    tree["experiment"]["kind"] = kind;
    for (auto& other : registry.kind_names())
      if (other != kind)
        tree.remove(other);
    // Simulation knows every fault kind and opens no data file; the other modes refuse some
    // faults, but still ask for their keys.
    for (auto mode : all_modes) {
      auto err = read_in(config_node{tree, "", reference_path + " (as kind " + kind + ")"},
                         registry, mode);
      INFO(kind, " in ", std::string{to_string(mode)}, " mode");
      if (mode == run_mode::sim)
        CHECK_MESSAGE(err.empty(), err);
    }
  }
  auto asked = asked_keys::recorded();
  asked_keys::stop();
  std::set<std::string> documented;
  walk(reference.raw(), "", documented);
  walk(YAML::Load(uncomment_alternatives(reference_path)), "", documented);
  std::string missing;
  size_t n_missing = 0;
  for (auto& p : asked)
    if (documented.count(p) == 0) {
      missing += "\n  " + p;
      ++n_missing;
    }
  INFO(asked.size(), " key paths asked for, ", documented.size(), " in the reference");
  CHECK_MESSAGE(missing.empty(), n_missing,
                " key paths asked for but missing from configs/reference.yaml:", missing);
  if (missing.empty())
    MESSAGE(asked.size(), " key paths asked for, all in configs/reference.yaml");
}

} // namespace starling::test::runtime_reference_test
