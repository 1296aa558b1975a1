#include <doctest/doctest.h>

#include <string>

#include "runtime/config/reader.hpp"

namespace starling::test::runtime_reader_test {

using namespace starling::runtime;

namespace {

/// Loads `text` as `x.yaml`; returns the error message (empty if it loaded).
std::string load_error(const std::string& text) {
  try {
    load_yaml_string(text, "x.yaml");
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

/// Runs `read` on the tree of `text`; returns the error message (empty if it passed).
template <class F>
std::string read_error(const std::string& text, F read) {
  try {
    auto root = load_yaml_string(text, "x.yaml");
    read(root);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

/// Loads `text`, applies `assignment`, returns the status.
starling::status set(config_node& root, const std::string& assignment) {
  return apply_override(root, assignment);
}

} // namespace

// -- duplicate keys ------------------------------------------------------------------------------

TEST_CASE("a key given twice in one map names both lines") {
  CHECK(load_error("experiment: {name: x}\nswarm:\n  trainers: 2\n  microbatch: 4\n"
                   "  trainers: 3\n")
        == "x.yaml:5: swarm.trainers: given twice (first at line 3)");
  CHECK(load_error("a: 1\nb: 2\na: 3\n") == "x.yaml:3: a: given twice (first at line 1)");
}

TEST_CASE("a duplicate key is found at any depth, in lists of maps and in flow maps") {
  CHECK(load_error("swarm:\n  stages:\n    - {peers: [1.0]}\n    - peers: [1.0]\n"
                   "      layers: [0, 1]\n      peers: [0.5]\n")
        == "x.yaml:6: swarm.stages[1].peers: given twice (first at line 4)");
  CHECK(load_error("caf:\n  scheduler: {policy: sharing, policy: stealing}\n")
        == "x.yaml:2: caf.scheduler.policy: given twice (first at line 2)");
  CHECK(load_error("a: [[{b: {c: 1, c: 2}}]]\n")
        == "x.yaml:1: a[0][0].b.c: given twice (first at line 1)");
}

TEST_CASE("the same key in different maps is not a duplicate") {
  CHECK(load_error("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n").empty());
}

TEST_CASE("a recursive alias is rejected instead of recursing forever") {
  CHECK(load_error("a: &r [1, *r]\n").find("nested more than") != std::string::npos);
}

// -- unknown keys --------------------------------------------------------------------------------

TEST_CASE("an unknown key names the keys allowed where it stands") {
  auto e = read_error("stage: {peers: [1.0], peerz: 2}\n", [](config_node& root) {
    auto s = root.child("stage");
    s.has("peers");
    s.has("layers");
    s.finish();
  });
  CHECK(e == "x.yaml:1: stage.peerz: unknown key (allowed here: layers, peers)");
}

TEST_CASE("allow() reports a misspelt key before errors its absence would cause") {
  auto read = [](config_node& root) {
    auto s = root.child("stage");
    s.allow({"peers", "layers"});
    if (!s.has("peers"))
      s.fail("missing required key 'peers'");
    s.finish();
  };
  CHECK(read_error("stage:\n  layers: [0, 1]\n  peerz: [1.0]\n", read)
        == "x.yaml:3: stage.peerz: unknown key (allowed here: layers, peers)");
  CHECK(read_error("stage:\n  layers: [0, 1]\n", read)
        == "x.yaml:2: stage: missing required key 'peers'");
  CHECK(read_error("stage:\n  layers: [0, 1]\n  peers: [1.0]\n", read).empty());
}

TEST_CASE("allow() on a scalar leaves the type error to the reader") {
  auto e = read_error("stage: 3\n", [](config_node& root) {
    auto s = root.child("stage");
    s.allow({"peers"});
    if (!s.is_map())
      s.expected("a map");
  });
  CHECK(e == "x.yaml:1: stage: expected a map, got \"3\"");
}

// -- --set overrides -----------------------------------------------------------------------------

TEST_CASE("--set replaces a scalar at a key path, through maps and list indices") {
  auto root = load_yaml_string("swarm:\n  trainers: 2\n  stages:\n    - {peers: [1.0, 0.5]}\n"
                               "    - {peers: [1.0]}\nexperiment: {duration: 60s}\n",
                               "x.yaml");
  REQUIRE(set(root, "swarm.trainers=3"));
  REQUIRE(set(root, "swarm.stages[1].peers[0]=0.25"));
  REQUIRE(set(root, " experiment.duration = 20s "));
  auto swarm = root.child("swarm");
  CHECK(swarm.child("trainers").as_int() == 3);
  auto stages = swarm.child("stages").items();
  CHECK(stages[1].child("peers").items()[0].as_double() == doctest::Approx(0.25));
  CHECK(stages[0].child("peers").items()[0].as_double() == doctest::Approx(1.0));
  CHECK(root.child("experiment").child("duration").as_duration() == std::chrono::seconds(20));
}

TEST_CASE("--set adds a new key to a map that exists, and the reader checks it like any key") {
  auto root = load_yaml_string("swarm:\n  trainers: 2\n", "x.yaml");
  REQUIRE(set(root, "swarm.microbatch=4"));
  REQUIRE(set(root, "swarm.trainerz=3"));
  auto swarm = root.child("swarm");
  CHECK(swarm.child("microbatch").as_int() == 4);
  swarm.has("trainers");
  try {
    swarm.finish();
    FAIL("the misspelt key was accepted");
  } catch (const config_error& e) {
    CHECK(std::string{e.what()}
          == "--set swarm.trainerz=3: unknown key (allowed here: microbatch, trainers)");
  }
}

TEST_CASE("an error at a value from --set names the argument, not a file line") {
  auto root = load_yaml_string("swarm:\n  trainers: 2\n", "x.yaml");
  REQUIRE(set(root, "swarm.trainers=many"));
  int64_t v = 0;
  auto swarm = root.child("swarm");
  CHECK_THROWS_WITH_AS(read_int(swarm, "trainers", v, 1, 1024),
                       "--set swarm.trainers=many: expected an integer in [1, 1024], got \"many\"",
                       config_error);
}

TEST_CASE("--set with bad syntax or a path that is not there fails with one clear line") {
  auto root = load_yaml_string("swarm:\n  trainers: 2\n  stages: [{peers: [1.0]}]\n", "x.yaml");
  auto syntax = [](const std::string& arg) {
    return "--set: expected KEY.PATH=VALUE (e.g. swarm.trainers=3 or "
           "swarm.stages[1].peers[0]=0.5), got \""
           + arg + "\"";
  };
  for (auto arg : {"swarm.trainers", "=3", "swarm..trainers=3", "swarm.=3", "[0]=1",
                   "swarm.stages[x]=1", "swarm.stages[]=1", "swarm.stages[0]peers=1",
                   "swarm.stages[0=1", "swarm tr=1", "swarm]=1"}) {
    INFO(arg);
    auto st = set(root, arg);
    CHECK_FALSE(st);
    CHECK(st.what() == syntax(arg));
  }
  CHECK(set(root, "swarm.model.layers=2").what()
        == "--set swarm.model.layers=2: swarm.model is not in the file (--set adds only the last "
           "key of a path, to a map that is)");
  CHECK(set(root, "swarm.stages[3].peers=1").what()
        == "--set swarm.stages[3].peers=1: swarm.stages has 1 item, so no [3]");
  CHECK(set(root, "swarm.trainers[0]=1").what()
        == "--set swarm.trainers[0]=1: swarm.trainers is not a list");
  CHECK(set(root, "swarm.trainers.x=1").what()
        == "--set swarm.trainers.x=1: swarm.trainers is not a map");
  CHECK(set(root, "swarm.stages=3").what()
        == "--set swarm.stages=3: swarm.stages is a list; --set replaces one value");
  CHECK(set(root, "swarm=3").what() == "--set swarm=3: swarm is a map; --set replaces one value");
  // Nothing of the failed attempts reached the tree.
  CHECK(root.child("swarm").child("trainers").as_int() == 2);
  CHECK_FALSE(root.child("swarm").has("model"));
}

} // namespace starling::test::runtime_reader_test
