// A stage peer's compute device as a FIFO queue on the actor's clock: each request occupies the
// device for its device seconds behind the requests before it, and its reply is due when it
// completes. Pure: the caller passes the clock's readings (CAF's clock: virtual in simulation).
#pragma once

#include <chrono>
#include <cstdint>

namespace starling::actors::stage {

/// One device serving requests in arrival order.
///
/// A request handled at `arrived` (the clock when the stage began handling it) whose backend
/// returned at `computed` needs `device_s` seconds of the device (its compute at the peer's
/// speed). Some backends compute in the call itself (LibTorch: `ran_s` seconds of real compute,
/// which a real-time clock sees pass between `arrived` and `computed` but a virtual clock does
/// not); others only model the time (`ran_s` = 0). The request starts when the device is free
/// and completes `device_s` later, less the real compute the clock did not see: so on a virtual
/// clock a real model at full speed costs no virtual time, and a slower device's extra time
/// (`device_s - ran_s`) becomes queue time in either clock.
class device_queue {
public:
  /// The clock's type (CAF's `actor_clock::time_point`); the queue never reads a clock.
  using time_point = std::chrono::steady_clock::time_point;

  /// Admits a request (see the class comment); returns when it completes, never before
  /// `computed` nor before the request admitted before it.
  time_point admit(time_point arrived, time_point computed, double device_s, double ran_s);

  /// Marks one admitted request as completed (its reply left).
  void complete() {
    if (queued_ > 0)
      --queued_;
  }

  /// Seconds of device time queued ahead of a request arriving at `now` (what a probe answers).
  double backlog(time_point now) const;

  /// Requests admitted and not completed.
  int64_t queued() const noexcept { return queued_; }

  /// When the device is free again.
  time_point busy_until() const noexcept { return busy_until_; }

private:
  time_point busy_until_{};
  int64_t queued_ = 0;
};

} // namespace starling::actors::stage
