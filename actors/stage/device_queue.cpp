#include "actors/stage/device_queue.hpp"

#include <algorithm>

namespace starling::actors::stage {

namespace {

std::chrono::nanoseconds seconds(double s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

} // namespace

void device_queue::push(uint64_t id, time_point arrived, double estimate_s, bool first) {
  request r{id, arrived, std::max(0.0, estimate_s)};
  waiting_s_ += r.estimate;
  (first ? first_ : rest_).push_back(r);
}

std::optional<device_queue::started> device_queue::start() {
  if (running_ || (first_.empty() && rest_.empty()))
    return std::nullopt;
  // A `first` request goes next, but two in a row only when nothing else waits.
  bool take_first = !first_.empty() && (rest_.empty() || !last_first_);
  auto& lane = take_first ? first_ : rest_;
  auto r = lane.front();
  lane.pop_front();
  last_first_ = take_first;
  // Reset when empty, so that rounding never leaves a phantom backlog.
  waiting_s_ = first_.empty() && rest_.empty() ? 0.0 : waiting_s_ - r.estimate;
  // Never before the request ahead of it completed.
  begin_ = std::max(r.arrived, busy_until_);
  busy_until_ = begin_ + seconds(r.estimate); // until it is computed
  running_ = true;
  return started{r.id, begin_};
}

device_queue::time_point device_queue::computed(time_point began, time_point computed,
                                                double device_s, double ran_s) {
  // Real compute the clock did not see pass (all of it on a virtual clock, none in real time).
  auto seen = std::chrono::duration<double>(computed - began).count();
  auto unseen = std::max(0.0, ran_s - std::max(0.0, seen));
  auto rest = std::max(0.0, device_s - unseen);
  // Never before the compute itself returned.
  busy_until_ = std::max(begin_ + seconds(rest), computed);
  return busy_until_;
}

double device_queue::backlog(time_point now) const {
  auto rest = running_ ? std::max(0.0, std::chrono::duration<double>(busy_until_ - now).count())
                       : 0.0;
  return rest + std::max(0.0, waiting_s_);
}

} // namespace starling::actors::stage
