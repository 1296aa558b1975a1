#include "actors/stage/device_queue.hpp"

#include <doctest/doctest.h>

namespace starling::test::actors_device_queue_test {

using starling::actors::stage::device_queue;
using namespace std::chrono_literals;

namespace {

const device_queue::time_point t0{std::chrono::seconds(1000)};

double secs(device_queue::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

/// Starts the next request and computes it at once on a virtual clock (no time passes while it
/// computes) needing `device_s`; returns its completion (seconds after t0), -1 when none starts.
double start(device_queue& q, double device_s, uint64_t* id = nullptr, double ran_s = 0) {
  auto s = q.start();
  if (!s)
    return -1;
  if (id)
    *id = s->id;
  return secs(q.computed(s->begin, s->begin, device_s, ran_s));
}

} // namespace

TEST_CASE("modeled requests queue behind each other in arrival order") {
  device_queue q;
  // Three requests of 0.4 s arrive together: they complete one after the other.
  for (uint64_t i = 1; i <= 3; ++i)
    q.push(i, t0, 0.4);
  CHECK(q.queued() == 3);
  // A probe at 0.1 s sees 1.1 s of work ahead once the first holds the device.
  uint64_t id = 0;
  CHECK(start(q, 0.4, &id) == doctest::Approx(0.4));
  CHECK(id == 1);
  CHECK(q.start() == std::nullopt); // one at a time
  CHECK(q.backlog(t0 + 100ms) == doctest::Approx(1.1));
  q.finish();
  CHECK(start(q, 0.4, &id) == doctest::Approx(0.8));
  CHECK(id == 2);
  q.finish();
  CHECK(start(q, 0.4, &id) == doctest::Approx(1.2));
  CHECK(id == 3);
  q.finish();
  CHECK(q.queued() == 0);
  CHECK(q.start() == std::nullopt);
  // A request arriving after the device went idle starts at once.
  q.push(4, t0 + 5s, 0.4);
  CHECK(start(q, 0.4) == doctest::Approx(5.4));
  q.finish();
  CHECK(q.backlog(t0 + 6s) == 0.0);
}

TEST_CASE("a request begins when the device is free, and its measured time replaces the "
          "estimate probes saw") {
  device_queue q;
  q.push(1, t0, 0.4);
  q.push(2, t0 + 100ms, 0.4);
  auto s = q.start();
  REQUIRE(s);
  CHECK(secs(s->begin) == doctest::Approx(0.0));
  // Until it is computed, probes count its estimate.
  CHECK(q.backlog(t0) == doctest::Approx(0.8));
  // It took 1 s, not 0.4: the next one begins at 1 s, when the device is free, not on arrival.
  CHECK(secs(q.computed(s->begin, s->begin, 1.0, 0)) == doctest::Approx(1.0));
  CHECK(q.backlog(t0 + 500ms) == doctest::Approx(0.5 + 0.4));
  q.finish();
  auto n = q.start();
  REQUIRE(n);
  CHECK(n->id == 2);
  CHECK(secs(n->begin) == doctest::Approx(1.0));
  CHECK(secs(q.computed(n->begin, n->begin, 0.2, 0)) == doctest::Approx(1.2));
  q.finish();
  // An estimate of nothing (no measurement yet) counts nothing; a negative one is clamped.
  q.push(3, t0 + 2s, -1.0);
  CHECK(q.backlog(t0 + 2s) == 0.0);
}

TEST_CASE("a waiting backward pass goes before waiting forward passes, alternating with them") {
  device_queue q;
  // Forwards 1 and 2 arrive, 1 holds the device; a backward (3) and a forward (4) arrive, then
  // two more backwards (5, 6): a backward goes next, then a forward, then a backward... and
  // when no forward waits any more, the backwards follow each other.
  q.push(1, t0, 0.4);
  CHECK(start(q, 0.4) == doctest::Approx(0.4));
  q.push(2, t0, 0.4);
  q.push(3, t0 + 100ms, 0.8, true);
  q.push(4, t0 + 100ms, 0.4);
  q.push(5, t0 + 200ms, 0.8, true);
  q.push(6, t0 + 200ms, 0.8, true);
  CHECK(q.backlog(t0 + 200ms) == doctest::Approx(0.2 + 0.4 + 0.8 + 0.4 + 0.8 + 0.8));
  std::vector<uint64_t> order;
  std::vector<double> done;
  q.finish();
  while (q.queued() > 0) {
    // Each request needs what it was expected to: backwards 0.8 s, forwards 0.4 s.
    auto st = q.start();
    REQUIRE(st);
    bool backward = st->id == 3 || st->id == 5 || st->id == 6;
    done.push_back(secs(q.computed(st->begin, st->begin, backward ? 0.8 : 0.4, 0)));
    order.push_back(st->id);
    q.finish();
  }
  CHECK(order == std::vector<uint64_t>{3, 2, 5, 4, 6});
  REQUIRE(done.size() == 5);
  CHECK(done[0] == doctest::Approx(1.2));
  CHECK(done[1] == doctest::Approx(1.6));
  CHECK(done[2] == doctest::Approx(2.4));
  CHECK(done[3] == doctest::Approx(2.8));
  CHECK(done[4] == doctest::Approx(3.6));
  CHECK(q.backlog(t0 + 4s) == 0.0);
}

TEST_CASE("real compute on a virtual clock costs only the emulated slowdown, in real time the "
          "whole device time") {
  // Virtual clock: the handler's compute took no virtual time.
  device_queue v;
  v.push(1, t0, 0.5);
  CHECK(start(v, 0.5, nullptr, 0.5) == doctest::Approx(0.0)); // full speed: no delay
  v.finish();
  v.push(2, t0, 1.0);
  CHECK(start(v, 1.0, nullptr, 0.5) == doctest::Approx(0.5)); // half speed: 0.5 s more
  v.push(3, t0, 1.0);
  v.finish();
  CHECK(start(v, 1.0, nullptr, 0.5) == doctest::Approx(1.0)); // behind the first
  // Real time: the clock saw the 0.5 s of compute pass; half speed completes 1 s after it began.
  device_queue r;
  r.push(1, t0, 1.0);
  auto s = r.start();
  REQUIRE(s);
  CHECK(secs(r.computed(t0, t0 + 500ms, 1.0, 0.5)) == doctest::Approx(1.0));
  // The next one waits for the device (1 s) and computes then (1.0 .. 1.5 s).
  r.push(2, t0 + 600ms, 1.0);
  r.finish();
  s = r.start();
  REQUIRE(s);
  CHECK(secs(s->begin) == doctest::Approx(1.0));
  CHECK(secs(r.computed(t0 + 1s, t0 + 1500ms, 1.0, 0.5)) == doctest::Approx(2.0));
  r.finish();
  // A faster-than-measured device never completes before the compute returned.
  device_queue f;
  f.push(1, t0, 0.25);
  s = f.start();
  REQUIRE(s);
  CHECK(secs(f.computed(t0, t0 + 500ms, 0.25, 0.5)) == doctest::Approx(0.5));
}

} // namespace starling::test::actors_device_queue_test
