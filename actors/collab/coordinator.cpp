#include "actors/collab/coordinator.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace starling::actors::collab {

namespace {

/// A held record at `step` that has not expired at `now` (the tracker holds no tombstones).
bool live_at(const held_record& h, uint64_t step, seconds now) {
  return h.record.step == step && now < h.expires_at;
}

/// An ETA this close to zero counts as reached: the extrapolation at the predicted instant can
/// fall a rounding error short of the target.
constexpr seconds eta_tolerance = 1e-6;

bool positive_finite(double v) {
  return v > 0 && std::isfinite(v);
}

} // namespace

status validate(const coordinator_options& o) {
  if (auto s = validate(o.progress); !s)
    return s;
  if (!(o.rate_alpha > 0 && o.rate_alpha <= 1))
    return fail(fmt::format("rate_alpha must be in (0, 1], got {}", o.rate_alpha));
  for (auto [name, v] : {std::pair{"publish_interval", o.publish_interval},
                         std::pair{"round_timeout", o.round_timeout},
                         std::pair{"state_round_timeout", o.state_round_timeout},
                         std::pair{"read_timeout", o.read_timeout},
                         std::pair{"download_timeout", o.download_timeout},
                         std::pair{"download_retry", o.download_retry}})
    if (!positive_finite(v))
      return fail(fmt::format("{} must be a positive number of seconds, got {}", name, v));
  if (o.max_donors == 0)
    return fail("max_donors must be at least 1, got 0");
  if (!(o.idle_after >= 0) || !std::isfinite(o.idle_after))
    return fail(fmt::format("idle_after must be 0 (never) or a number of seconds, got {}",
                            o.idle_after));
  return {};
}

coordinator::coordinator(std::string self, coordinator_options opts, uint64_t step)
    : self_(std::move(self)),
      opts_(opts),
      tracker_(self_, opts.progress),
      local_(opts.rate_alpha),
      step_(step) {
  // Nothing runs until `start`.
}

progress_record coordinator::own_record(seconds now) const {
  progress_record r;
  r.peer = self_;
  r.time = now;
  r.client_mode = opts_.mode == peer_mode::client;
  if (phase_ == coordinator_phase::averaging) {
    // While its round runs the peer still stands at that step with the samples it put in, so
    // that peers still deciding see the collaboration's true total and join the round.
    r.step = round_step_;
    r.samples = round_samples_;
  } else {
    r.step = step_;
    r.samples = local_.samples();
  }
  r.resync = resync_due_;
  r.rate = contributes() ? own_rate(now) : 0.0;
  return r;
}

double coordinator::own_rate(seconds now) const {
  if (opts_.idle_after > 0 && now - last_samples_at_ >= opts_.idle_after)
    return 0.0;
  return local_.rate();
}

progress_estimate coordinator::estimate(seconds now) const {
  auto own = contributes() ? local_.samples() : 0;
  return tracker_.estimate(step_, own, contributes() ? own_rate(now) : 0.0, now);
}

std::vector<effect> coordinator::start(seconds now) {
  effects out;
  if (phase_ != coordinator_phase::idle)
    return out;
  phase_ = coordinator_phase::accumulating;
  local_.idle(now);
  last_samples_at_ = now;
  next_refresh_ = now;
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::samples_done(uint64_t samples, seconds now) {
  effects out;
  stats_.samples_reported += samples;
  if (phase_ == coordinator_phase::left || phase_ == coordinator_phase::idle || !contributes()) {
    stats_.samples_dropped += samples;
    return out;
  }
  local_.add(samples, now);
  last_samples_at_ = now;
  dirty_ = true;
  if (phase_ == coordinator_phase::averaging)
    stats_.samples_stale += samples;
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::progress_read(const std::vector<progress_entry>& entries,
                                               seconds now) {
  effects out;
  if (phase_ == coordinator_phase::left || phase_ == coordinator_phase::idle)
    return out;
  read_in_flight_ = false;
  auto summary = tracker_.observe(entries, now);
  stats_.reads++;
  stats_.records_rejected += summary.rejected;
  has_view_ = true;
  seen_others_ = seen_others_ || !tracker_.records().empty();
  auto e = estimate(now);
  if (e.peers > 1)
    deserted_ = false;
  // "The ETA has passed" is judged against the ETA of the last read, as DeDLOC does: between
  // reads the peer trusts the prediction instead of the records it no longer refreshes.
  eta_at_ = e.eta_at;
  // An auxiliary peer has no samples of its own to improve the estimate between reads, and a
  // round it enters late finds the group closed: it reads as often as the bounds allow.
  next_refresh_ = now + (contributes() ? e.refresh_in : opts_.progress.min_refresh);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::progress_read_failed(seconds now) {
  effects out;
  if (phase_ == coordinator_phase::left || phase_ == coordinator_phase::idle)
    return out;
  if (read_in_flight_) {
    read_in_flight_ = false;
    stats_.reads_failed++;
    next_refresh_ = now + opts_.read_timeout;
  }
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::round_done(uint64_t id, seconds now, size_t group) {
  effects out;
  if (phase_ != coordinator_phase::averaging || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  round_group_ = group;
  finish_round(round_end::averaged, now, out);
  round_group_ = 0;
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::round_partial(uint64_t id, seconds now, size_t group) {
  effects out;
  if (phase_ != coordinator_phase::averaging || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  stats_.rounds_partial++;
  round_group_ = group;
  round_partial_ = true;
  finish_round(round_end::averaged, now, out);
  round_partial_ = false;
  round_group_ = 0;
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::round_failed(uint64_t id, seconds now) {
  effects out;
  if (phase_ != coordinator_phase::averaging || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  stats_.rounds_failed++;
  if (opts_.lone_steps_when_deserted && contributes() && has_view_ && estimate(now).peers <= 1)
    deserted_ = true;
  bool own = opts_.step_on_failure && round_samples_ > 0 && contributes();
  if (round_samples_ == 0 && contributes()) {
    await_samples_ = true;
    await_step_ = round_step_;
  }
  finish_round(own ? round_end::own : round_end::skipped, now, out);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::state_round_done(uint64_t id, seconds now) {
  effects out;
  if (phase_ != coordinator_phase::state_averaging || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  end_state_round(true, now, out);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::state_round_failed(uint64_t id, seconds now) {
  effects out;
  if (phase_ != coordinator_phase::state_averaging || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  end_state_round(false, now, out);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::download_done(uint64_t id, uint64_t loaded_step, seconds now) {
  effects out;
  if (phase_ != coordinator_phase::downloading || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  end_download(true, loaded_step, now, out);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::download_failed(uint64_t id, seconds now) {
  effects out;
  if (phase_ != coordinator_phase::downloading || id != op_id_) {
    stats_.stale_answers++;
    return out;
  }
  end_download(false, 0, now, out);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::timer(seconds now) {
  effects out;
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::peer_left(const std::string& peer, seconds now) {
  effects out;
  tracker_.forget(peer);
  advance(now, out);
  return out;
}

std::vector<effect> coordinator::leave(seconds now) {
  effects out;
  if (phase_ == coordinator_phase::left)
    return out;
  switch (phase_) {
  case coordinator_phase::averaging:
    out.emplace_back(abandon_round{op_id_});
    // The round's samples never reach an update.
    stats_.samples_dropped += round_samples_;
    round_samples_ = 0;
    break;
  case coordinator_phase::state_averaging:
    out.emplace_back(abandon_state_round{op_id_});
    break;
  case coordinator_phase::downloading:
    out.emplace_back(abandon_download{op_id_});
    break;
  default:
    break;
  }
  stats_.samples_dropped += local_.take();
  bool started = phase_ != coordinator_phase::idle;
  phase_ = coordinator_phase::left;
  if (started) {
    auto r = own_record(now);
    r.withdrawn = true;
    // Outlives every record published before (the DHT keeps the record that expires last).
    out.emplace_back(withdraw_progress{encode_progress(r), now + opts_.progress.record_lifetime});
  }
  return out;
}

void coordinator::advance(seconds now, effects& out) {
  if (phase_ == coordinator_phase::left || phase_ == coordinator_phase::idle)
    return;
  if (read_in_flight_ && now >= read_deadline_) {
    read_in_flight_ = false;
    stats_.reads_failed++;
    next_refresh_ = now;
  }
  if (now >= op_deadline_) {
    switch (phase_) {
    case coordinator_phase::averaging: {
      // Stop waiting: a peer that left mid-round must not hold this one any longer.
      out.emplace_back(abandon_round{op_id_});
      stats_.rounds_timed_out++;
      bool own = opts_.step_on_failure && round_samples_ > 0 && contributes();
      finish_round(own ? round_end::own : round_end::skipped, now, out);
      break;
    }
    case coordinator_phase::state_averaging:
      out.emplace_back(abandon_state_round{op_id_});
      end_state_round(false, now, out);
      break;
    case coordinator_phase::downloading:
      out.emplace_back(abandon_download{op_id_});
      end_download(false, 0, now, out);
      break;
    default:
      break;
    }
  }
  if (phase_ == coordinator_phase::accumulating)
    decide(now, out);
  bool reads =
      phase_ == coordinator_phase::accumulating || phase_ == coordinator_phase::state_averaging;
  if (reads && !read_in_flight_ && now >= next_refresh_) {
    publish(now, out);
    out.emplace_back(read_progress{});
    read_in_flight_ = true;
    read_deadline_ = now + opts_.read_timeout;
  } else if (now >= publish_due()) {
    publish(now, out);
  }
  auto wake = publish_due();
  if (read_in_flight_)
    wake = std::min(wake, read_deadline_);
  else if (reads)
    wake = std::min(wake, next_refresh_);
  if (phase_ == coordinator_phase::accumulating && has_view_ && eta_at_ > now)
    wake = std::min(wake, eta_at_);
  if (phase_ == coordinator_phase::averaging || phase_ == coordinator_phase::state_averaging ||
      phase_ == coordinator_phase::downloading)
    wake = std::min(wake, op_deadline_);
  if (std::isfinite(wake) && wake != last_wake_) {
    last_wake_ = wake;
    out.emplace_back(wake_at{wake});
  }
}

void coordinator::decide(seconds now, effects& out) {
  if (!has_view_)
    return;
  auto e = estimate(now);
  // The refresh formula applied to the estimate as the peer's own work improves it: a peer
  // nearing the target reads (and sees the others) before it would step on its own count.
  next_refresh_ = std::min(next_refresh_, now + e.refresh_in);
  if (!e.ahead.empty()) {
    if (!contributes()) {
      // An auxiliary peer holds no state: it just stands where the collaboration stands.
      step_ = e.ahead.front().step;
      eta_at_ = std::numeric_limits<double>::infinity();
      return;
    }
    start_download(e, now, out);
    if (phase_ == coordinator_phase::downloading)
      return;
  }
  if (opts_.resync_by_download && resync_due_ && contributes()) {
    // Stepped alone since the last update; peers at this step that did not hold the
    // collaboration's state: take theirs (see the file comment).
    if (auto donors = consensus_donors(now); !donors.empty()) {
      stats_.resync_downloads++;
      download_from(step_, std::move(donors), true, now, out);
      return;
    }
  }
  // The ETA stands in for the others' samples, which the peer cannot see between reads; a peer
  // that counts nobody but itself knows its own count exactly and waits for the target.
  bool alone = e.peers <= 1 && contributes();
  if (alone && (!seen_others_ || deserted_)) {
    // Nobody else ever showed up: a round would wait its whole matchmaking window for nobody
    // and step on the own gradient anyway. (A peer that saw others before and now sees none
    // is cut off or deserted: it tries one round; once that found nobody it steps alone like
    // this until a read shows another peer, and resyncs when it averages with them again.)
    if (e.reached)
      step_solo(now, out);
    return;
  }
  if (await_samples_ && await_step_ == step_ && local_.samples() == 0 &&
      !samples_seen_at(step_, now))
    return; // only extrapolated samples: the last round at this step found none
  if (e.reached || e.eta <= eta_tolerance || (now >= eta_at_ && !alone))
    start_round_now(now, out);
}

bool coordinator::samples_seen_at(uint64_t step, seconds now) const {
  const auto& rs = tracker_.records();
  return std::any_of(rs.begin(), rs.end(), [&](const held_record& h) {
    return !h.presumed && h.record.samples > 0 && live_at(h, step, now);
  });
}

void coordinator::step_solo(seconds now, effects& out) {
  auto samples = local_.take();
  stats_.own_steps++;
  stats_.solo_steps++;
  stats_.samples_alone += samples;
  out.emplace_back(step_alone{++next_id_, step_, samples});
  // A peer that had partners steps away from them: it asks for a state round once it averages
  // with them again.
  if (seen_others_ && contributes() && opts_.resync_after_lone_step)
    resync_due_ = true;
  step_++;
  // The new step is news for a peer that joins; the next read comes at its usual time.
  dirty_ = true;
  (void)now;
}

void coordinator::start_round_now(seconds now, effects& out) {
  op_id_ = ++next_id_;
  op_deadline_ = now + opts_.round_timeout;
  round_step_ = step_;
  round_samples_ = contributes() ? local_.take() : 0;
  phase_ = coordinator_phase::averaging;
  stats_.rounds++;
  out.emplace_back(start_round{op_id_, round_step_, round_samples_, op_deadline_});
  if (!opts_.delay_updates)
    pause(out);
}

void coordinator::finish_round(round_end how, seconds now, effects& out) {
  // Decided before the step moves on: the flags others published at the step that ends.
  bool asked = how != round_end::skipped && contributes() && opts_.resync_after_lone_step &&
               (resync_due_ || others_ask_resync(round_step_, now));
  switch (how) {
  case round_end::averaged:
    stats_.rounds_averaged++;
    stats_.samples_averaged += round_samples_;
    if (contributes())
      out.emplace_back(apply_averaged{op_id_, round_step_});
    step_ = round_step_ + 1;
    break;
  case round_end::own:
    stats_.own_steps++;
    stats_.samples_alone += round_samples_;
    out.emplace_back(step_own{op_id_, round_step_, round_samples_});
    step_ = round_step_ + 1;
    break;
  case round_end::skipped:
    // No update: the step stays, so a peer whose partners did step sees them ahead at its next
    // read and downloads their state instead of drifting away from it.
    stats_.skipped_steps++;
    stats_.samples_dropped += round_samples_;
    if (contributes())
      out.emplace_back(skip_step{op_id_, round_step_});
    break;
  }
  round_samples_ = 0;
  phase_ = coordinator_phase::accumulating;
  resume(now, out);
  if (how == round_end::averaged && !round_partial_ && has_view_ && whole_step_averaged(now)) {
    // The peers of the last read at that step averaged with this one and stepped with it: their
    // progress towards the new step is predicted from now on at their rates, so the next round
    // starts on time even though the read asked below still returns their old records (steps
    // shorter than a read's round trip overshot the target batch several times without this).
    tracker_.presume_stepped(round_step_, now);
    eta_at_ = estimate(now).eta_at;
  } else {
    // The last read describes the step that just ended: decide on a new one.
    has_view_ = false;
    eta_at_ = std::numeric_limits<double>::infinity();
  }
  // Tell the collaboration about the new step and learn where it stands, now.
  next_refresh_ = now;
  bool periodic = how != round_end::skipped && opts_.average_state_every > 0 && contributes() &&
                  step_ % opts_.average_state_every == 0;
  if (asked) {
    // This round follows the lone step (or this update was the lone step and a peer asks anyway):
    // it covers every lone step so far.
    start_state_round_now(true, now, out);
  } else if (periodic) {
    start_state_round_now(false, now, out);
  } else if ((how == round_end::own || round_partial_) && contributes()
             && opts_.resync_after_lone_step) {
    // Not right away: the failure that sent the peer stepping alone may not be over, and the
    // others learn from the flagged record to join after the next update.
    resync_due_ = true;
    resync_retry_ = false;
  }
}

void coordinator::start_state_round_now(bool resync, seconds now, effects& out) {
  op_id_ = ++next_id_;
  op_deadline_ = now + opts_.state_round_timeout;
  phase_ = coordinator_phase::state_averaging;
  stats_.state_rounds++;
  state_resync_ = resync;
  state_retry_ = resync && resync_due_ && resync_retry_;
  if (resync)
    stats_.resyncs++;
  resync_due_ = false;
  resync_retry_ = false;
  out.emplace_back(start_state_round{op_id_, step_, op_deadline_, resync});
}

bool coordinator::others_ask_resync(uint64_t step, seconds now) const {
  const auto& rs = tracker_.records();
  return std::any_of(rs.begin(), rs.end(), [&](const held_record& h) {
    return h.record.resync && live_at(h, step, now);
  });
}

void coordinator::end_state_round(bool loaded, seconds now, effects& out) {
  if (loaded) {
    stats_.state_rounds_loaded++;
    out.emplace_back(load_averaged_state{op_id_});
  } else {
    stats_.state_rounds_failed++;
    if (state_resync_) {
      stats_.resyncs_failed++;
      // Once more after the next update; a retry that fails too is given up (no loop).
      if (!state_retry_) {
        resync_due_ = true;
        resync_retry_ = true;
      }
    }
  }
  state_resync_ = false;
  state_retry_ = false;
  phase_ = coordinator_phase::accumulating;
  (void)now;
}

void coordinator::start_download(const progress_estimate& e, seconds now, effects& out) {
  // Donors must hold the same state: all at one step, the highest that has any full-mode peer
  // (a client-mode peer accepts no connections, so it cannot serve).
  uint64_t step = 0;
  std::vector<std::string> donors;
  for (const auto& p : e.ahead) {
    if (p.client_mode)
      continue;
    if (donors.empty())
      step = p.step;
    else if (p.step != step)
      break;
    if (donors.size() < opts_.max_donors)
      donors.push_back(p.peer);
  }
  if (donors.empty())
    return; // only clients are ahead: keep going; a donor shows up at a later read
  download_from(step, std::move(donors), false, now, out);
}

bool coordinator::whole_step_averaged(seconds now) const {
  if (round_group_ == 0)
    return true; // the owner does not say: presume as before
  size_t at_step = 1; // this peer
  for (const auto& h : tracker_.records())
    if (live_at(h, round_step_, now))
      at_step++;
  return round_group_ >= at_step;
}

std::vector<std::string> coordinator::consensus_donors(seconds now) const {
  // Peers at this step that took its averaged update (any mode: clients count, but serve no
  // state), and those that stepped alone too (this one included).
  std::vector<std::string> donors;
  size_t in_sync = 0, apart = 1;
  for (const auto& h : tracker_.records()) {
    const auto& r = h.record;
    if (h.presumed || !live_at(h, step_, now))
      continue;
    if (r.resync) {
      apart++;
      continue;
    }
    in_sync++;
    if (!r.client_mode && donors.size() < opts_.max_donors)
      donors.push_back(r.peer);
  }
  // Only when most of the step stayed together: where many stepped alone (rounds failing all
  // over), downloads would pause peer after peer while the others wait for them in the next
  // rounds; a state round brings those back instead.
  if (in_sync <= apart)
    donors.clear();
  return donors;
}

void coordinator::download_from(uint64_t step, std::vector<std::string> donors, bool resync,
                                seconds now, effects& out) {
  download_state d;
  d.step = step;
  d.resync = resync;
  d.donors = std::move(donors);
  op_id_ = ++next_id_;
  op_deadline_ = now + opts_.download_timeout;
  d.id = op_id_;
  d.deadline = op_deadline_;
  phase_ = coordinator_phase::downloading;
  stats_.downloads++;
  pause(out);
  out.emplace_back(std::move(d));
}

void coordinator::end_download(bool ok, uint64_t loaded_step, seconds now, effects& out) {
  phase_ = coordinator_phase::accumulating;
  eta_at_ = std::numeric_limits<double>::infinity();
  // The view that sent the peer downloading is stale either way: decide on a new read.
  tracker_.observe({}, now);
  has_view_ = false;
  if (ok) {
    stats_.downloads_done++;
    step_ = loaded_step;
    // The donor's state replaces the own one: nothing left to resync.
    resync_due_ = false;
    resync_retry_ = false;
    if (!opts_.keep_gradients_on_download) {
      auto dropped = local_.take();
      stats_.samples_dropped += dropped;
      out.emplace_back(discard_gradients{});
    }
    next_refresh_ = now;
  } else {
    stats_.downloads_failed++;
    next_refresh_ = now + opts_.download_retry;
  }
  resume(now, out);
}

void coordinator::pause(effects& out) {
  if (paused_ || !contributes())
    return;
  paused_ = true;
  out.emplace_back(pause_compute{});
}

void coordinator::resume(seconds now, effects& out) {
  if (!paused_)
    return;
  paused_ = false;
  // The pause is not slow work: the rate is measured from here.
  local_.idle(now);
  out.emplace_back(resume_compute{});
}

seconds coordinator::publish_due() const {
  if (dirty_)
    return last_publish_ + opts_.publish_interval;
  // Keep the record alive even when nothing changes (no reads while a round or download runs).
  return last_publish_ + std::min(opts_.progress.max_refresh, opts_.progress.record_lifetime / 2);
}

void coordinator::publish(seconds now, effects& out) {
  last_publish_ = now;
  dirty_ = false;
  out.emplace_back(
      publish_progress{encode_progress(own_record(now)), now + opts_.progress.record_lifetime});
}

} // namespace starling::actors::collab
