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
/// A request is computed when it gets the device, not when it arrives: a gradient is taken on the
/// parameters of the moment the device runs it, as on a real accelerator's stream. (Computing on
/// arrival and holding the reply for the modeled queue time made every queued backward's gradient
/// older by its wait: with seconds of queue at a slow peer, a step's gradient was one step stale
/// and the run diverged, the bursts of issue 38.) While it waits, probes count its estimated
/// device seconds; once it ran, `computed` says what it really needs: `device_s` seconds of the
/// device (its compute at the peer's speed), of which the backend ran `ran_s` in the call itself
/// (LibTorch: real compute, which a real-time clock sees pass while it runs but a virtual clock
/// does not; a model: 0). It completes `device_s` after it began, less the real compute the clock
/// did not see, and never before the compute returned: so on a virtual clock a real model at full
/// speed costs no virtual time, and a slower device's extra time (`device_s - ran_s`) becomes
/// queue time in either clock.
class device_queue {
public:
  /// The clock's type (CAF's `actor_clock::time_point`); the queue never reads a clock.
  using time_point = std::chrono::steady_clock::time_point;

  /// A request that got the device: compute it now, then call `computed`.
  struct started {
    uint64_t id = 0;
    /// When the device took it: its arrival or the previous request's completion.
    time_point begin;
  };

  /// Adds request `id`, arrived at `arrived`, expected to need `estimate_s` device seconds (what
  /// probes count while it waits); `first`: it goes before the waiting requests without the
  /// flag, one at a time (alternating with them while both wait).
  void push(uint64_t id, time_point arrived, double estimate_s, bool first = false);

  /// When no request holds the device and one waits: gives it the device and returns it. None
  /// while a request holds the device.
  std::optional<started> start();

  /// The request holding the device was computed: the caller began at `began` and the backend
  /// returned at `computed` (clock readings), needing `device_s` device seconds of which it ran
  /// `ran_s` in the call. Returns when the request completes (call `finish` then).
  time_point computed(time_point began, time_point computed, double device_s, double ran_s);

  /// The request holding the device completed.
  void finish() { running_ = false; }

  /// Seconds of device time ahead of a request arriving at `now` (what a probe answers): the rest
  /// of the running request and the estimates of every waiting one.
  double backlog(time_point now) const;

  /// Requests holding or waiting for the device.
  int64_t queued() const noexcept {
    return static_cast<int64_t>(first_.size() + rest_.size()) + (running_ ? 1 : 0);
  }

  /// A request holds the device.
  bool running() const noexcept { return running_; }

  /// When the running request completes (or the last one completed; its estimate until it was
  /// computed).
  time_point busy_until() const noexcept { return busy_until_; }

private:
  struct request {
    uint64_t id = 0;
    time_point arrived;
    /// Its estimated device seconds.
    double estimate = 0;
  };

  time_point busy_until_{};
  /// When the running request began.
  time_point begin_{};
  bool running_ = false;
  /// The last request started came from `first_`.
  bool last_first_ = false;
  std::deque<request> first_, rest_;
  /// Estimated device seconds of the waiting requests.
  double waiting_s_ = 0;
};

} // namespace starling::actors::stage
