#include "actors/stage/device_queue.hpp"

#include <doctest/doctest.h>

using starling::actors::stage::device_queue;
using namespace std::chrono_literals;

namespace {

const device_queue::time_point t0{std::chrono::seconds(1000)};

double secs(device_queue::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

} // namespace

TEST_CASE("modeled requests queue behind each other in arrival order") {
  device_queue q;
  // Three requests of 0.4 s arrive together: they complete one after the other.
  CHECK(secs(q.admit(t0, t0, 0.4, 0)) == doctest::Approx(0.4));
  CHECK(secs(q.admit(t0, t0, 0.4, 0)) == doctest::Approx(0.8));
  CHECK(secs(q.admit(t0, t0, 0.4, 0)) == doctest::Approx(1.2));
  CHECK(q.queued() == 3);
  // A probe at 0.1 s sees 1.1 s of work ahead.
  CHECK(q.backlog(t0 + 100ms) == doctest::Approx(1.1));
  q.complete();
  CHECK(q.queued() == 2);
  // A request arriving after the device went idle starts at once.
  CHECK(secs(q.admit(t0 + 5s, t0 + 5s, 0.4, 0)) == doctest::Approx(5.4));
  CHECK(q.backlog(t0 + 6s) == 0.0);
}

TEST_CASE("real compute on a virtual clock costs only the emulated slowdown, in real time the "
          "whole device time") {
  // Virtual clock: the handler's compute took no virtual time.
  device_queue v;
  CHECK(secs(v.admit(t0, t0, 0.5, 0.5)) == doctest::Approx(0.0)); // full speed: no delay
  CHECK(secs(v.admit(t0, t0, 1.0, 0.5)) == doctest::Approx(0.5)); // half speed: 0.5 s more
  CHECK(secs(v.admit(t0, t0, 1.0, 0.5)) == doctest::Approx(1.0)); // behind the first
  // Real time: the clock saw the 0.5 s of compute pass; half speed completes 1 s after arrival.
  device_queue r;
  CHECK(secs(r.admit(t0, t0 + 500ms, 1.0, 0.5)) == doctest::Approx(1.0));
  // The next one computed while the first was held (0.6 .. 1.1 s): it follows the first.
  CHECK(secs(r.admit(t0 + 600ms, t0 + 1100ms, 1.0, 0.5)) == doctest::Approx(2.0));
  // A faster-than-measured device never completes before the compute returned.
  device_queue f;
  CHECK(secs(f.admit(t0, t0 + 500ms, 0.25, 0.5)) == doctest::Approx(0.5));
}
