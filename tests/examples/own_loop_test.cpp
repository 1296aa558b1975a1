// The own-loop example (examples/own_loop): a user's own LibTorch loop in two processes on
// loopback, joined through the collaborative optimizer; both end at the same global step with
// the same parameters.
#include <doctest/doctest.h>

#include <memory>
#include <regex>

#include "support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::examples_own_loop_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

const std::string binary = std::string{STARLING_BUILD_DIR} + "/example_own_loop";

/// What a peer's final line says.
struct final_line {
  uint64_t step = 0;
  std::string digest;
  uint64_t together = 0;
};

/// The last progress line ("global step N (what) ...") of `out`.
std::string last_step_line(const std::string& out) {
  auto at = out.rfind("]: global step ");
  if (at == std::string::npos)
    return {};
  return out.substr(at, out.find('\n', at) - at);
}

final_line final_of(subprocess& p) {
  auto line = p.wait_for("done: global step", 60s);
  REQUIRE_MESSAGE(line, p.output());
  std::smatch m;
  REQUIRE(std::regex_search(*line, m,
                            std::regex{R"(global step (\d+) digest ([0-9a-f]+) \(together (\d+))"}));
  return {std::stoull(m[1]), m[2], std::stoull(m[3])};
}

} // namespace

TEST_CASE("two processes of the own-loop example end with identical parameters") {
  const std::string steps = "4";
  subprocess a{{binary, "--name", "a", "--steps", steps, "--max-seconds", "40"}};
  auto listening = a.wait_for("listening on", 30s);
  REQUIRE_MESSAGE(listening, a.output());
  auto endpoint = listening->substr(listening->rfind(' ') + 1);
  subprocess b{{binary, "--name", "b", "--join", endpoint, "--steps", steps, "--max-seconds", "40"}};
  auto fa = final_of(a);
  auto fb = final_of(b);
  CHECK(a.wait_exit(30s) == 0);
  CHECK(b.wait_exit(30s) == 0);
  INFO(a.output());
  INFO(b.output());
  CHECK(fa.step >= 4);
  CHECK(fa.step == fb.step);
  // Their last global step was taken together, on the same averaged gradient.
  CHECK(fa.together >= 1);
  CHECK(fb.together >= 1);
  CHECK(last_step_line(a.output()).find("global step " + std::to_string(fa.step)
                                        + " (stepped together") != std::string::npos);
  CHECK(last_step_line(b.output()).find("global step " + std::to_string(fb.step)
                                        + " (stepped together") != std::string::npos);
  CHECK(fa.digest == fb.digest);
}

TEST_CASE("a peer joining the own-loop example late downloads the state and steps with the others") {
  // Groups matched anew every step (--fresh-groups): the newcomer gets into the next round.
  const std::string steps = "10";
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> argv{binary, "--name", name, "--steps", steps, "--fresh-groups",
                                  "--max-seconds", "40"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<subprocess>(argv);
  };
  auto a = run("a", {});
  auto listening = a->wait_for("listening on", 30s);
  REQUIRE_MESSAGE(listening, a->output());
  auto endpoint = listening->substr(listening->rfind(' ') + 1);
  auto b = run("b", {"--join", endpoint});
  REQUIRE_MESSAGE(a->wait_for("global step 2 ", 30s), a->output());
  auto c = run("c", {"--join", endpoint, "--peers", "3"});
  auto fa = final_of(*a);
  auto fb = final_of(*b);
  auto fc = final_of(*c);
  INFO(a->output());
  INFO(b->output());
  INFO(c->output());
  CHECK(a->wait_exit(30s) == 0);
  CHECK(b->wait_exit(30s) == 0);
  CHECK(c->wait_exit(30s) == 0);
  CHECK(c->output().find("(state downloaded)") != std::string::npos);
  CHECK(fc.together >= 1);
  // The newcomer ends with the parameters of a peer that ended at its step. (Not all three:
  // with groups matched anew each step, a peer whose request reaches the leader after the
  // matchmaking window steps alone, and at the last step nothing brings it back; seen once in
  // a loaded suite run: a at 11 after a lone step, b and c at 10 together.)
  bool same_as_one = (fa.step == fc.step && fa.digest == fc.digest)
                     || (fb.step == fc.step && fb.digest == fc.digest);
  CHECK(same_as_one);
}

} // namespace starling::test::examples_own_loop_test
