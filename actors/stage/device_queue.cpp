#include "actors/stage/device_queue.hpp"

#include <algorithm>

namespace starling::actors::stage {

namespace {

std::chrono::nanoseconds seconds(double s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

} // namespace

device_queue::time_point device_queue::admit(time_point arrived, time_point computed,
                                             double device_s, double ran_s) {
  auto start = std::max(arrived, busy_until_);
  // Real compute the clock did not see pass (all of it on a virtual clock, none in real time).
  auto seen = std::chrono::duration<double>(computed - arrived).count();
  auto unseen = std::max(0.0, ran_s - std::max(0.0, seen));
  auto done = start + seconds(std::max(0.0, device_s - unseen));
  // FIFO: never before the request ahead of it, never before the compute itself returned.
  busy_until_ = std::max({done, busy_until_, computed});
  ++queued_;
  return busy_until_;
}

double device_queue::backlog(time_point now) const {
  return std::max(0.0, std::chrono::duration<double>(busy_until_ - now).count());
}

} // namespace starling::actors::stage
