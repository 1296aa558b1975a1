// A stage peer's compute device as a queue on the actor's clock: one request holds the device at
// a time for its device seconds, the others wait, and a reply is due when its request completes.
// Backward passes may go first (`first`): a waiting backward takes the device before the
// waiting forwards, but never two backwards in a row while a forward waits (1F1B alternation).
// A microbatch on its way back then waits behind at most one queued forward, so the first
// microbatches of a run complete within about one pipeline latency instead of behind every
// forward admitted before them, and a stream of backwards never starves the forwards (strict
// priority did: in the 1000-peer simulation forwards waited past their hop timeout and retries
// went up fivefold). Pure: the caller passes the clock's readings (CAF's clock: virtual in
// simulation) and starts the next request when one completes.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

namespace starling::actors::stage {

/// One device serving requests one at a time, each lane (`first` requests, the others) in
/// arrival order: a `first` request goes next unless the last one started was a `first` request
/// and another waits.
///
/// A request handled at `arrived` (the clock when the stage began handling it) whose backend
/// returned at `computed` needs `device_s` seconds of the device (its compute at the peer's
/// speed). Some backends compute in the call itself (LibTorch: `ran_s` seconds of real compute,
/// which a real-time clock sees pass between `arrived` and `computed` but a virtual clock does
/// not); others only model the time (`ran_s` = 0). A request starts when the device is free (at
/// the earliest when it arrived) and completes `device_s` later, less the real compute the clock
/// did not see, and never before `computed`: so on a virtual clock a real model at full speed
/// costs no virtual time, and a slower device's extra time (`device_s - ran_s`) becomes queue
/// time in either clock.
class device_queue {
public:
  /// The clock's type (CAF's `actor_clock::time_point`); the queue never reads a clock.
  using time_point = std::chrono::steady_clock::time_point;

  /// A request that got the device.
  struct started {
    uint64_t id = 0;
    /// When it completes (call `finish` then).
    time_point done;
  };

  /// Adds request `id` (see the class comment); `first`: it goes before the waiting requests
  /// without the flag, one at a time (alternating with them while both wait).
  void push(uint64_t id, time_point arrived, time_point computed, double device_s, double ran_s,
            bool first = false);

  /// When no request holds the device and one waits: gives it the device (started no earlier than
  /// the previous one completed) and returns it. None while a request holds the device.
  std::optional<started> start();

  /// The request holding the device completed.
  void finish() { running_ = false; }

  /// Seconds of device time ahead of a request arriving at `now` (what a probe answers): the rest
  /// of the running request and every waiting one.
  double backlog(time_point now) const;

  /// Requests holding or waiting for the device.
  int64_t queued() const noexcept {
    return static_cast<int64_t>(first_.size() + rest_.size()) + (running_ ? 1 : 0);
  }

  /// A request holds the device.
  bool running() const noexcept { return running_; }

  /// When the running request completes (or the last one completed).
  time_point busy_until() const noexcept { return busy_until_; }

private:
  struct request {
    uint64_t id = 0;
    time_point arrived, computed;
    /// Device time the clock still has to see pass.
    double seconds = 0;
  };

  time_point busy_until_{};
  bool running_ = false;
  /// The last request started came from `first_`.
  bool last_first_ = false;
  std::deque<request> first_, rest_;
  /// Device seconds of the waiting requests.
  double waiting_s_ = 0;
};

} // namespace starling::actors::stage
