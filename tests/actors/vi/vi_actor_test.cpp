#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/vi/vi.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"
#include "messages/vi.hpp"
#include "tests/support/test_system.hpp"

namespace starling::test::actors_vi_actor_test {

using namespace starling;
using namespace starling::actors::vi;
using starling::messages::vi_report;

namespace {

/// A deterministic actor system (CAF-NOTES, "Deterministic tests with doctest").
using starling::test::test_system;

std::shared_ptr<const bilinear_problem> small_problem() {
  bilinear_options o;
  o.dim_per_player = 20;
  o.workers = 4;
  o.seed = 3;
  return std::make_shared<const bilinear_problem>(*bilinear_problem::make(o));
}

struct run_outcome {
  std::optional<vi_report> report;
  std::optional<std::string> error;
};

/// Spawns the graph, asks the server for `iterations`, optionally kills worker `victim` after
/// `kill_after` scheduler steps, and runs to quiescence. Kills every actor before returning.
run_outcome run_actors(test_system& ts, std::shared_ptr<const bilinear_problem> p,
                       const server_options& so, uint64_t iterations, int victim = -1,
                       std::size_t kill_after = 0) {
  std::vector<caf::actor> workers;
  for (std::size_t i = 0; i < p->workers(); ++i)
    workers.push_back(spawn_worker(*ts.sys, p, i, so.method));
  auto server = spawn_server(*ts.sys, p->dim(), workers, so);
  auto out = std::make_shared<run_outcome>();
  auto& sys = *ts.sys;
  auto client = sys.spawn([=, &sys](caf::event_based_actor* self) {
    self->request(server, caf::infinite, vi_run_atom::value, iterations)
      .then([=](vi_report& r) { out->report = std::move(r); },
            [=, &sys](caf::error& e) { out->error = sys.render(e); });
  });
  if (victim >= 0) {
    ts.sched->run(kill_after);
    caf::anon_send_exit(workers[static_cast<std::size_t>(victim)], caf::exit_reason::kill);
  }
  ts.run_all();
  for (auto& w : workers)
    caf::anon_send_exit(w, caf::exit_reason::kill);
  caf::anon_send_exit(server, caf::exit_reason::kill);
  caf::anon_send_exit(client, caf::exit_reason::kill);
  ts.run_all();
  return *out;
}

server_options masha1_options(const bilinear_problem& p, worker_loss_policy policy) {
  server_options so;
  so.method = recommended_options(method_kind::masha1, p, {codec_kind::rand_k, 4},
                                  {codec_kind::rand_k, 4}, 21);
  so.on_worker_loss = policy;
  so.timeout = std::chrono::milliseconds{1000};
  return so;
}

} // namespace

TEST_CASE("the actor run of MASHA1 and MASHA2 reproduces the pure run exactly") {
  auto p = small_problem();
  for (auto method : {method_kind::masha1, method_kind::masha2, method_kind::extragradient}) {
    test_system ts;
    auto so = masha1_options(*p, worker_loss_policy::fail);
    const auto codec = method == method_kind::masha2 ? codec_spec{codec_kind::top_k, 4}
                                                     : codec_spec{codec_kind::rand_k, 4};
    so.method = recommended_options(method, *p, codec, codec, 21);
    const uint64_t iterations = 120;
    auto pure = run_pure(p, so.method, {iterations, 0});
    REQUIRE(pure.ok());
    auto got = run_actors(ts, p, so, iterations);
    REQUIRE_MESSAGE(got.report.has_value(), got.error.value_or("no reply"));
    CHECK(got.report->iterations == iterations);
    CHECK(got.report->live_workers == p->workers());
    CHECK(got.report->z == pure->z); // bit-for-bit: same messages, same arithmetic
    CHECK(got.report->bits_up > 0);
    MESSAGE(to_string(method) << ": relative error after " << iterations
                              << " iterations: " << p->relative_error(got.report->z));
  }
}

TEST_CASE("a second run request continues where the first stopped, as one run would") {
  auto p = small_problem();
  test_system ts;
  auto so = masha1_options(*p, worker_loss_policy::fail);
  auto pure = run_pure(p, so.method, {120, 0});
  REQUIRE(pure.ok());
  auto& sys = *ts.sys;
  std::vector<caf::actor> workers;
  for (std::size_t i = 0; i < p->workers(); ++i)
    workers.push_back(spawn_worker(sys, p, i, so.method));
  auto server = spawn_server(sys, p->dim(), workers, so);
  auto reports = std::make_shared<std::vector<vi_report>>();
  auto error = std::make_shared<std::string>();
  auto client = sys.spawn([=, &sys](caf::event_based_actor* self) {
    self->request(server, caf::infinite, vi_run_atom::value, uint64_t{50})
      .then(
        [=, &sys](vi_report& first) {
          reports->push_back(std::move(first));
          self->request(server, caf::infinite, vi_run_atom::value, uint64_t{70})
            .then([=](vi_report& second) { reports->push_back(std::move(second)); },
                  [=, &sys](caf::error& e) { *error = sys.render(e); });
        },
        [=, &sys](caf::error& e) { *error = sys.render(e); });
  });
  ts.run_all();
  REQUIRE_MESSAGE(reports->size() == 2, *error);
  CHECK((*reports)[0].iterations == 50);
  CHECK((*reports)[1].iterations == 120);
  CHECK((*reports)[1].bits_up > (*reports)[0].bits_up);
  CHECK((*reports)[1].z == pure->z); // the segments replay the single run bit for bit
  for (auto& w : workers)
    caf::anon_send_exit(w, caf::exit_reason::kill);
  caf::anon_send_exit(server, caf::exit_reason::kill);
  caf::anon_send_exit(client, caf::exit_reason::kill);
  ts.run_all();
}

TEST_CASE("a worker killed mid-run fails the run with a clear error under on_worker_loss = fail") {
  test_system ts;
  auto p = small_problem();
  auto got = run_actors(ts, p, masha1_options(*p, worker_loss_policy::fail), 200, 2, 40);
  REQUIRE_FALSE(got.report.has_value());
  REQUIRE(got.error.has_value());
  MESSAGE(*got.error);
  CHECK(got.error->find("worker 2 lost") != std::string::npos);
  CHECK(got.error->find("on_worker_loss = fail") != std::string::npos);
}

TEST_CASE("a worker killed mid-run is dropped under on_worker_loss = continue") {
  test_system ts;
  auto p = small_problem();
  auto got = run_actors(ts, p, masha1_options(*p, worker_loss_policy::continue_run), 200, 1, 40);
  REQUIRE_MESSAGE(got.report.has_value(), got.error.value_or("no reply"));
  CHECK(got.report->iterations == 200);
  CHECK(got.report->live_workers == p->workers() - 1);
}

TEST_CASE("vi message types round-trip through CAF's binary serialization") {
  test_system ts;
  messages::vi_downlink d;
  d.round = 7;
  d.phase = 1;
  d.coin = true;
  d.payload.codec = 2;
  d.payload.dim = 10;
  d.payload.indices = {1, 5};
  d.payload.values = {0.5f, -2.0f};
  std::vector<char> buf;
  caf::binary_serializer sink{*ts.sys, buf};
  auto msg = caf::make_message(d);
  REQUIRE_FALSE(caf::message::save(sink, msg));
  CHECK(buf.size() > 0);
  caf::binary_deserializer source{*ts.sys, buf};
  caf::message back;
  REQUIRE_FALSE(back.load(source));
  REQUIRE(back.match_element<messages::vi_downlink>(0));
  const auto& e = back.get_as<messages::vi_downlink>(0);
  CHECK(e.round == 7);
  CHECK(e.coin);
  CHECK(e.payload.indices == d.payload.indices);
  CHECK(e.payload.values == d.payload.values);
}

} // namespace starling::test::actors_vi_actor_test
