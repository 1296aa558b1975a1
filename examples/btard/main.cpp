// configs/btard-fmnist.yaml in C++: 16 peers, 7 of them Byzantine, train an MLP on Fashion-MNIST
// with the plain mean, CenteredClip alone and BTARD side by side, and check BTARD's audit log.
//   example_btard [--attack NAME] [--steps N] [--seed S] [--out DIR]
// NAME is a gradient attack (sign_flip, random_direction, label_flip, delayed, ipm, alie) or a
// protocol attack (protocol.hpp's list); the default is sign_flip.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "runtime/btard/experiment.hpp"

using namespace starling;
namespace bt = starling::actors::btard;

int main(int argc, char** argv) {
  runtime::btard::experiment_options o;
  o.name = "btard-fmnist";
  o.seed = 1;
  o.peers = 16;
  o.byzantine = 7;
  o.steps = 300;
  o.rules = {bt::aggregation_rule::mean, bt::aggregation_rule::centered_clip,
             bt::aggregation_rule::btard};
  o.attack.kind = bt::attack_kind::sign_flip;
  o.attack.start_step = 50;
  o.attack.direction_seed = o.seed;
  o.tau_factor = 2;
  o.group.lr = 0.1;
  o.group.momentum = 0.9;
  o.model.hidden = 64;
  o.model.batch = 32;
  o.synthetic_when_absent = true;
  std::string out = "runs/example-btard";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "example_btard: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--attack") {
      auto name = value();
      o.attack.kind = bt::attack_kind::none;
      if (auto g = bt::parse_attack(name))
        o.attack.kind = *g;
      else if (auto p = bt::parse_protocol_attack(name))
        o.protocol = *p;
      else if (name != "none") {
        fmt::print(stderr, "example_btard: unknown attack '{}'\n", name);
        return 2;
      }
    } else if (a == "--steps") {
      o.steps = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--seed") {
      o.seed = o.attack.direction_seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--out") {
      out = value();
    } else {
      fmt::print(stderr, "usage: example_btard [--attack NAME] [--steps N] [--seed S] [--out DIR]\n");
      return 2;
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    fmt::print(stderr, "example_btard: cannot create {}: {}\n", out, ec.message());
    return 1;
  }
  auto r = runtime::btard::run_experiment(o, out);
  if (!r) {
    fmt::print(stderr, "example_btard: {}\n", r.error().what);
    return 1;
  }
  return 0;
}
