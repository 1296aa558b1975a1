// The one state-download client (actors/collab/state_download.hpp): parts from several donors,
// the fallbacks to whole states (raced or in turn), steps below the minimum, the most trained of
// several, verified whole states, cancellation. Donors are small actors in one actor system.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/collab/state_download.hpp"
#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"

namespace starling::test::actors_state_download_test {

using namespace starling;
using namespace std::chrono_literals;
using actors::collab::donor_source;
using actors::collab::download_options;
using actors::collab::downloaded_state;
using actors::collab::fetch_state;
using actors::collab::whole_policy;
using messages::stage_state;
using messages::stage_state_part;

namespace {

stage_state make_state(uint64_t steps, uint64_t seed) {
  torch::manual_seed(seed);
  stage_state s;
  s.params.tensor = torch::randn({1000});
  s.moments.tensor = torch::rand({2000});
  s.optimizer_steps = {steps, steps};
  s.steps = steps;
  s.samples = 100 * steps;
  return s;
}

/// How a donor misbehaves.
struct donor_faults {
  bool parts = false;  // refuses part requests
  bool whole = false;  // refuses whole requests
  bool digest = false; // sends parts whose digest is not its state's
};

struct donor_state {
  stage_state s;
  donor_faults faults;
  uint64_t parts_asked = 0;
  uint64_t whole_asked = 0;
};

caf::behavior donor(caf::stateful_actor<donor_state>* self, stage_state s, donor_faults f) {
  self->state.s = std::move(s);
  self->state.faults = f;
  return {
    [=](get_atom, state_atom) -> caf::result<stage_state> {
      ++self->state.whole_asked;
      if (self->state.faults.whole)
        return caf::make_error(caf::sec::runtime_error, "no whole state here");
      return self->state.s;
    },
    [=](get_atom, state_atom, uint64_t part, uint64_t parts) -> caf::result<stage_state_part> {
      ++self->state.parts_asked;
      auto& st = self->state;
      if (st.faults.parts)
        return caf::make_error(caf::sec::runtime_error, "no parts here");
      auto digest = actors::stage::state_digest(st.s);
      if (st.faults.digest)
        digest[0] = static_cast<char>(digest[0] ^ 1);
      auto p = actors::stage::cut_state_part(st.s, digest, part, parts);
      if (!p)
        return caf::make_error(caf::sec::invalid_argument, p.error().what);
      return std::move(*p);
    },
    [=](status_atom) {
      return std::vector<uint64_t>{self->state.parts_asked, self->state.whole_asked};
    },
  };
}

struct outcome {
  bool got = false;
  uint64_t steps = 0;
  uint64_t donors = 0;
  double params_sum = 0;
  std::string why;
};

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<caf::actor> donors;

  fixture() {
    messages::register_types(cfg);
    cfg.set("scheduler.max-threads", 2);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
  }

  ~fixture() {
    for (auto& d : donors)
      caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
  }

  void add(stage_state s, donor_faults f = {}) {
    donors.push_back(sys->spawn(donor, std::move(s), f));
  }

  /// Runs one download and waits for its end (a bounded wait: every donor answers at once).
  outcome run(download_options o) {
    caf::scoped_actor self{*sys};
    auto me = caf::actor_cast<caf::actor>(self);
    auto source = donor_source::of(donors);
    sys->spawn([=](caf::event_based_actor* a) {
      fetch_state(
        a, source, o,
        [=](downloaded_state d) {
          a->send(me, true, d.state.steps, static_cast<uint64_t>(d.donors),
                  d.state.params.tensor.sum().item<double>(), std::string{});
          a->quit();
        },
        [=](const std::string& why) {
          a->send(me, false, uint64_t{0}, uint64_t{0}, 0.0, why);
          a->quit();
        });
    });
    outcome out;
    bool answered = false;
    self->receive(
      [&](bool got, uint64_t steps, uint64_t n, double sum, std::string& why) {
        answered = true;
        out = outcome{got, steps, n, sum, std::move(why)};
      },
      caf::after(std::chrono::seconds(30)) >> [] {});
    REQUIRE(answered);
    return out;
  }

  /// Parts and whole requests donor `i` received.
  std::vector<uint64_t> asked(size_t i) {
    caf::scoped_actor self{*sys};
    std::vector<uint64_t> out;
    self->request(donors[i], 10s, status_atom::value)
      .receive([&](std::vector<uint64_t>& v) { out = std::move(v); }, [](caf::error&) {});
    REQUIRE(out.size() == 2);
    return out;
  }
};

download_options with_timeout() {
  download_options o;
  o.timeout = 10s;
  return o;
}

} // namespace

TEST_CASE("three donors at one state: a part from each, put together and verified") {
  fixture f;
  auto s = make_state(5, 1);
  for (int i = 0; i < 3; ++i)
    f.add(s);
  auto r = f.run(with_timeout());
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.steps == 5);
  CHECK(r.donors == 3);
  CHECK(r.params_sum == doctest::Approx(s.params.tensor.sum().item<double>()));
  for (size_t i = 0; i < 3; ++i)
    CHECK(f.asked(i) == std::vector<uint64_t>{1, 0});
}

TEST_CASE("a donor that refuses its part: whole states raced from every donor") {
  fixture f;
  auto s = make_state(5, 1);
  f.add(s);
  f.add(s, {true, false, false});
  f.add(s);
  auto r = f.run(with_timeout());
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.steps == 5);
  CHECK(r.donors == 1);
  CHECK(r.params_sum == doctest::Approx(s.params.tensor.sum().item<double>()));
  for (size_t i = 0; i < 3; ++i)
    CHECK(f.asked(i)[1] == 1);
}

TEST_CASE("parts of different states are refused; in turn, the first good donor ends it") {
  fixture f;
  f.add(make_state(5, 1), {false, true, false}); // serves parts, refuses its whole state
  f.add(make_state(6, 2));                       // stepped meanwhile: its part does not fit
  f.add(make_state(5, 1));
  auto o = with_timeout();
  o.parts_fail_fast = false;
  o.whole = whole_policy::in_turn;
  auto r = f.run(o);
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.donors == 1);
  CHECK(r.steps == 6); // donor 0 refused, donor 1 answered first
  CHECK(f.asked(0) == std::vector<uint64_t>{1, 1});
  CHECK(f.asked(1) == std::vector<uint64_t>{1, 1});
  CHECK(f.asked(2) == std::vector<uint64_t>{1, 0}); // never asked for a whole state
}

TEST_CASE("donors behind the minimum step give nothing, and say so") {
  fixture f;
  f.add(make_state(3, 1));
  f.add(make_state(3, 1));
  auto o = with_timeout();
  o.min_steps = 4;
  auto r = f.run(o);
  CHECK_FALSE(r.got);
  CHECK(r.why.find("step 3, 4 needed") != std::string::npos);
  o.whole = whole_policy::in_turn;
  o.parts = false;
  r = f.run(o);
  CHECK_FALSE(r.got);
  CHECK(r.why.find("step 3, 4 needed") != std::string::npos);
}

TEST_CASE("newest: the most trained of every donor's whole state") {
  fixture f;
  f.add(make_state(3, 1));
  f.add(make_state(7, 2));
  f.add(make_state(5, 3));
  auto o = with_timeout();
  o.parts = false;
  o.newest = true;
  auto r = f.run(o);
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.steps == 7);
  CHECK(r.params_sum == doctest::Approx(make_state(7, 2).params.tensor.sum().item<double>()));
}

TEST_CASE("a whole state asked as one part is checked against its digest") {
  fixture f;
  f.add(make_state(4, 1), {false, false, true}); // a digest that is not its state's
  f.add(make_state(4, 2));
  auto o = with_timeout();
  o.parts = false;
  o.whole = whole_policy::in_turn;
  o.whole_as_part = true;
  auto r = f.run(o);
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.params_sum == doctest::Approx(make_state(4, 2).params.tensor.sum().item<double>()));
  CHECK(f.asked(0) == std::vector<uint64_t>{1, 0});
  fixture g;
  g.add(make_state(4, 1), {false, false, true});
  r = g.run(o);
  CHECK_FALSE(r.got);
  CHECK(r.why.find("digest") != std::string::npos);
}

TEST_CASE("a state the caller refuses counts as a donor's failure") {
  fixture f;
  auto small = make_state(4, 1);
  small.params.tensor = torch::randn({10}); // another model
  f.add(small);
  f.add(make_state(4, 2));
  auto o = with_timeout();
  o.refuse = [](const stage_state& s) {
    return s.params.tensor.numel() == 1000 ? std::string{} : std::string{"another model"};
  };
  o.whole = whole_policy::in_turn;
  o.parts = false;
  auto r = f.run(o);
  REQUIRE_MESSAGE(r.got, r.why);
  CHECK(r.params_sum == doctest::Approx(make_state(4, 2).params.tensor.sum().item<double>()));
  o.refuse = [](const stage_state&) { return std::string{"another model"}; };
  r = f.run(o);
  CHECK_FALSE(r.got);
  CHECK(r.why == "donor 1: another model");
  o.parts = true; // the parts of one state put together, then refused: whole states, refused too
  fixture g;
  g.add(make_state(4, 1));
  g.add(make_state(4, 1));
  r = g.run(o);
  CHECK_FALSE(r.got);
  CHECK(r.why.find("another model") != std::string::npos);
}

TEST_CASE("no donor, and a cancelled download that asks nobody") {
  fixture f;
  auto r = f.run(with_timeout());
  CHECK_FALSE(r.got);
  CHECK(r.why == "no donor");
  f.add(make_state(1, 1));
  f.add(make_state(1, 1));
  auto calls = std::make_shared<int>(0);
  caf::scoped_actor self{*f.sys};
  auto o = with_timeout();
  o.cancelled = [] { return true; };
  auto source = donor_source::of(f.donors);
  auto client = f.sys->spawn([=](caf::event_based_actor* a) {
    fetch_state(
      a, source, o, [=](downloaded_state) { ++*calls; }, [=](const std::string&) { ++*calls; });
    a->quit();
  });
  self->wait_for(client);
  CHECK(*calls == 0);
  CHECK(f.asked(0) == std::vector<uint64_t>{0, 0});
  CHECK(f.asked(1) == std::vector<uint64_t>{0, 0});
}

} // namespace starling::test::actors_state_download_test
