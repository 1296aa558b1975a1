#include "actors/collab/coordinator.hpp"

#include <doctest/doctest.h>

#include <random>

namespace starling::test::actors_coordinator_test {

using namespace starling::actors::collab;

namespace {

template <class T>
std::vector<T> all(const std::vector<effect>& es) {
  std::vector<T> out;
  for (const auto& e : es)
    if (auto* p = std::get_if<T>(&e))
      out.push_back(*p);
  return out;
}

template <class T>
bool has(const std::vector<effect>& es) {
  return !all<T>(es).empty();
}

template <class T>
T one(const std::vector<effect>& es) {
  auto v = all<T>(es);
  REQUIRE(v.size() == 1);
  return v.front();
}

coordinator_options options(uint64_t target = 100) {
  coordinator_options o;
  o.progress.target_batch = target;
  o.round_timeout = 30;
  return o;
}

progress_entry peer_at(const std::string& id, uint64_t step, uint64_t samples, double rate,
                       seconds t, bool client = false, seconds expires = 1e9) {
  progress_record r{id, step, samples, rate, t, client, false};
  return {id, encode_progress(r), expires};
}

/// Every sample reported sits in exactly one place.
void check_accounting(const coordinator& c) {
  const auto& s = c.stats();
  CHECK(s.samples_reported == s.samples_averaged + s.samples_alone + s.samples_dropped +
                                  c.pending_samples() + c.round_samples());
}

} // namespace

TEST_CASE("options of the collaborative optimizer are validated") {
  CHECK(validate(coordinator_options{}).ok());
  auto o = coordinator_options{};
  o.round_timeout = 0;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.max_donors = 0;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.rate_alpha = 0;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.progress.target_batch = 0;
  CHECK_FALSE(validate(o).ok());
}

TEST_CASE("a server peer whose samples stopped coming counts its rate as 0 and starts no round") {
  auto o = options(100);
  o.delay_updates = true;
  o.idle_after = 2;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 0, 0, 0)}, 0);
  // 10 samples per second for 3 s: the rate is measured, the target is 70 samples away.
  for (int t = 1; t <= 3; ++t)
    c.samples_done(10, t);
  CHECK(c.own_record(3).rate > 0);
  CHECK(c.estimate(3).eta < 1e9);
  // Then nothing for idle_after: its record and its estimate say it makes no progress, so the
  // ETA never passes and no round starts on samples that never come.
  CHECK(c.own_record(5).rate == 0);
  CHECK(c.estimate(5).rate == 0);
  std::vector<effect> es;
  for (int t = 5; t <= 60; ++t) {
    auto more = c.timer(t);
    auto read = has<read_progress>(more);
    es.insert(es.end(), more.begin(), more.end());
    if (read)
      es = c.progress_read({peer_at("b", 0, 0, 0, t)}, t);
    CHECK_FALSE(has<start_round>(es));
  }
  CHECK(c.stats().rounds == 0);
  CHECK(c.pending_samples() == 30);
  // Without idle_after (a peer that computes by itself) the rate stays.
  coordinator d("d", options(100));
  d.start(0);
  for (int t = 1; t <= 3; ++t)
    d.samples_done(10, t);
  CHECK(d.own_record(60).rate > 0);
  o.idle_after = -1;
  CHECK_FALSE(validate(o).ok());
}

TEST_CASE("joining publishes the peer's record and reads the collaboration's") {
  coordinator c("a", options());
  auto es = c.start(10);
  auto pub = one<publish_progress>(es);
  auto rec = decode_progress(pub.value);
  REQUIRE(rec.ok());
  CHECK(rec->peer == "a");
  CHECK(rec->step == 0);
  CHECK(rec->time == 10.0);
  CHECK(pub.expires_at == 10.0 + c.options().progress.record_lifetime);
  CHECK(has<read_progress>(es));
  // The next thing to wake for is the read's deadline.
  CHECK(one<wake_at>(es).at == 10.0 + c.options().read_timeout);
  CHECK(c.phase() == coordinator_phase::accumulating);
}

TEST_CASE("a normal round: the target is reached, the gradient is averaged and applied") {
  coordinator c("a", options(100));
  c.start(0);
  // b has 60 samples at 10/s: 40 to go at 10/s.
  auto es = c.progress_read({peer_at("b", 0, 60, 10, 0)}, 0);
  CHECK_FALSE(has<start_round>(es));
  // Refresh after ETA'·N / max(N + 3, 1.2·N) = 2·2/5, ETA' presuming our own rate, not measured
  // yet, at b's (40 samples at 20/s); the ETA itself (4 s, b's rate alone) is later.
  CHECK(one<wake_at>(es).at == doctest::Approx(0.8));
  // Our 50 samples at t = 1: 50 + 60 + 10 = 120 >= 100.
  es = c.samples_done(50, 1);
  auto r = one<start_round>(es);
  CHECK(r.step == 0);
  CHECK(r.samples == 50);
  CHECK(r.deadline == 31.0);
  CHECK(has<pause_compute>(es));
  CHECK(c.phase() == coordinator_phase::averaging);
  CHECK(c.round_samples() == 50);
  CHECK(c.pending_samples() == 0);
  // While the round runs the peer still publishes step 0 with its round's samples.
  auto own = c.own_record(2);
  CHECK(own.step == 0);
  CHECK(own.samples == 50);
  es = c.round_done(r.id, 2);
  auto ap = one<apply_averaged>(es);
  CHECK(ap.id == r.id);
  CHECK(ap.step == 0);
  CHECK(has<resume_compute>(es));
  CHECK_FALSE(has<step_own>(es));
  // Tells the collaboration about the new step at once, and reads.
  auto rec = decode_progress(one<publish_progress>(es).value);
  REQUIRE(rec.ok());
  CHECK(rec->step == 1);
  CHECK(rec->samples == 0);
  CHECK(has<read_progress>(es));
  CHECK(c.step() == 1);
  CHECK(c.stats().rounds_averaged == 1);
  CHECK(c.stats().samples_averaged == 50);
  check_accounting(c);
}

TEST_CASE("a failed round steps on the peer's own gradient") {
  coordinator c("a", options(100));
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(20, 1));
  auto es = c.round_failed(r.id, 3);
  auto own = one<step_own>(es);
  CHECK(own.id == r.id);
  CHECK(own.step == 0);
  CHECK(own.samples == 20);
  CHECK_FALSE(has<apply_averaged>(es));
  CHECK(has<resume_compute>(es));
  CHECK(c.step() == 1);
  CHECK(c.stats().own_steps == 1);
  CHECK(c.stats().samples_alone == 20);
  check_accounting(c);
}

TEST_CASE("a failed round without own samples takes no step and stays at its step") {
  coordinator c("a", options(100));
  c.start(0);
  // b alone has reached the target: we join with weight 0.
  auto r = one<start_round>(c.progress_read({peer_at("b", 0, 100, 0, 0)}, 0));
  CHECK(r.samples == 0);
  auto es = c.round_failed(r.id, 1);
  CHECK(one<skip_step>(es).step == 0);
  CHECK(c.step() == 0);
  // b stepped: at the next read it is ahead, and we download its state instead of drifting.
  es = c.progress_read({peer_at("b", 1, 0, 10, 1)}, 1);
  CHECK(one<download_state>(es).step == 1);
}

TEST_CASE("a peer that stepping without averaging is off drops its gradient on failure") {
  auto o = options(100);
  o.step_on_failure = false;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(20, 1));
  auto es = c.round_failed(r.id, 2);
  CHECK(has<skip_step>(es));
  CHECK(c.stats().samples_dropped == 20);
  check_accounting(c);
}

TEST_CASE("a peer behind the collaboration downloads the state from several donors") {
  auto o = options(100);
  o.max_donors = 2;
  coordinator c("a", o);
  c.start(0);
  c.samples_done(30, 1);
  auto es =
      c.progress_read({peer_at("c", 5, 1, 1, 1), peer_at("b", 5, 1, 1, 1), peer_at("d", 5, 1, 1, 1),
                       peer_at("cl", 6, 1, 1, 1, true), peer_at("old", 4, 1, 1, 1)},
                      1);
  // The highest step with a full peer: 6 has only a client, which nobody can connect to.
  auto d = one<download_state>(es);
  CHECK(d.step == 5);
  CHECK(d.donors == std::vector<std::string>{"b", "c"});
  CHECK(d.deadline == 1 + o.download_timeout);
  CHECK(has<pause_compute>(es));
  CHECK_FALSE(has<start_round>(es));
  CHECK(c.phase() == coordinator_phase::downloading);
  es = c.download_done(d.id, 5, 4);
  CHECK(has<discard_gradients>(es));
  CHECK(has<resume_compute>(es));
  CHECK(has<read_progress>(es));
  CHECK(c.step() == 5);
  CHECK(c.pending_samples() == 0);
  CHECK(c.stats().samples_dropped == 30);
  check_accounting(c);
}

TEST_CASE("a newcomer mid-run downloads the state and contributes to the next step") {
  coordinator c("new", options(100));
  c.start(50);
  auto d = one<download_state>(
      c.progress_read({peer_at("b", 12, 40, 20, 50), peer_at("c", 12, 20, 20, 50)}, 50));
  CHECK(d.step == 12);
  c.download_done(d.id, 12, 52);
  CHECK(c.step() == 12);
  // Its samples now count at step 12, with the others'.
  c.samples_done(30, 53);
  auto es = c.progress_read({peer_at("b", 12, 50, 20, 53), peer_at("c", 12, 20, 20, 53)}, 53);
  auto r = one<start_round>(es);
  CHECK(r.step == 12);
  CHECK(r.samples == 30);
  es = c.round_done(r.id, 54);
  CHECK(one<apply_averaged>(es).step == 12);
  CHECK(c.step() == 13);
  check_accounting(c);
}

TEST_CASE("a download can keep the accumulated gradient for the next step") {
  auto o = options(100);
  o.keep_gradients_on_download = true;
  coordinator c("a", o);
  c.start(0);
  c.samples_done(30, 1);
  auto d = one<download_state>(c.progress_read({peer_at("b", 2, 0, 1, 1)}, 1));
  auto es = c.download_done(d.id, 2, 2);
  CHECK_FALSE(has<discard_gradients>(es));
  CHECK(c.pending_samples() == 30);
  CHECK(c.step() == 2);
  check_accounting(c);
}

TEST_CASE("a failed download resumes work and retries after a pause") {
  auto o = options(100);
  coordinator c("a", o);
  c.start(0);
  auto d = one<download_state>(c.progress_read({peer_at("b", 2, 0, 1, 1)}, 1));
  auto es = c.download_failed(d.id, 2);
  CHECK(has<resume_compute>(es));
  CHECK_FALSE(has<read_progress>(es));
  CHECK(one<wake_at>(es).at == 2 + o.download_retry);
  CHECK(c.step() == 0);
  es = c.timer(2 + o.download_retry);
  CHECK(has<read_progress>(es));
  // A download that never answers is abandoned at its deadline.
  d = one<download_state>(c.progress_read({peer_at("b", 2, 0, 1, 7)}, 7));
  es = c.timer(d.deadline);
  CHECK(one<abandon_download>(es).id == d.id);
  CHECK(c.stats().downloads_failed == 2);
  // Its late answer changes nothing.
  es = c.download_done(d.id, 2, d.deadline + 1);
  CHECK(es.empty());
  CHECK(c.step() == 0);
}

TEST_CASE("only client-mode peers ahead: no download, work goes on") {
  coordinator c("a", options(100));
  c.start(0);
  auto es = c.progress_read({peer_at("cl", 3, 0, 1, 0, true)}, 0);
  CHECK_FALSE(has<download_state>(es));
  CHECK(c.phase() == coordinator_phase::accumulating);
}

TEST_CASE("a peer that leaves mid-round does not block the others past the deadline") {
  coordinator c("a", options(100));
  c.start(0);
  c.progress_read({peer_at("b", 0, 50, 10, 0)}, 0);
  auto r = one<start_round>(c.samples_done(60, 1));
  CHECK(r.deadline == 31.0);
  // b left mid-round: nothing answers. Until the deadline the peer waits.
  auto es = c.timer(30.5);
  CHECK_FALSE(has<abandon_round>(es));
  CHECK(c.phase() == coordinator_phase::averaging);
  // The wake-up the core asked for is the deadline.
  es = c.timer(31);
  CHECK(one<abandon_round>(es).id == r.id);
  CHECK(one<step_own>(es).samples == 60);
  CHECK(c.step() == 1);
  CHECK(c.stats().rounds_timed_out == 1);
  // The averager's late answer is ignored: no second update.
  es = c.round_done(r.id, 32);
  CHECK(es.empty());
  CHECK(c.stats().stale_answers == 1);
  check_accounting(c);
}

TEST_CASE("the round deadline is among the wake-ups the core asks for") {
  coordinator c("a", options(100));
  c.start(0);
  // Nobody makes progress: the next read would be after the longest period, 30 s.
  CHECK(one<wake_at>(c.progress_read({peer_at("b", 0, 99, 0, 0)}, 0)).at == 30.0);
  auto es = c.samples_done(1, 1);
  auto r = one<start_round>(es);
  CHECK(r.deadline == 31.0);
  // No read while the round runs: the next wake-up is the deadline (with the record's
  // keep-alive publish, due then too).
  CHECK(one<wake_at>(es).at == r.deadline);
  CHECK(c.timer(30).empty());
  es = c.timer(31);
  CHECK(has<abandon_round>(es));
  CHECK(has<publish_progress>(es));
}

TEST_CASE("new samples are published at most once per publish interval") {
  auto o = options(1000);
  o.publish_interval = 1;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({}, 0);
  auto es = c.samples_done(5, 0.25);
  CHECK_FALSE(has<publish_progress>(es));
  CHECK(one<wake_at>(es).at == 1.0);
  c.samples_done(5, 0.5);
  es = c.samples_done(5, 1.0);
  auto pub = decode_progress(one<publish_progress>(es).value);
  CHECK(pub->samples == 15);
  CHECK(pub->time == 1.0);
  // Nothing new: the next publish is the keep-alive, not the interval.
  es = c.timer(2.0);
  CHECK_FALSE(has<publish_progress>(es));
}

TEST_CASE("a peer nearing the target on its own count reads before it would step alone") {
  coordinator c("a", options(100));
  c.start(0);
  // The first read knows no rate: the next read would be 30 s away.
  CHECK(one<wake_at>(c.progress_read({}, 0)).at == 30.0);
  // At 10 samples/s alone it would reach 100 at t = 10; the refresh formula over its own
  // improving estimate (ETA/4 for one peer) brings the reads forward, answered here with
  // nobody else.
  std::vector<int> reads;
  for (int i = 1; i <= 9; ++i) {
    auto es = c.samples_done(10, i);
    if (has<read_progress>(es)) {
      reads.push_back(i);
      c.progress_read({}, i);
    }
  }
  REQUIRE(!reads.empty());
  // At t = 1 the ETA is 9 s: the next read is due at 1 + 9/4.
  CHECK(reads.front() == 4);
  CHECK(reads.size() >= 3);
}

TEST_CASE("a peer whose first read showed its peers before their rates were measured reads "
          "again as soon as the target could be near") {
  // 64 peers that start together (the first records say rate 0), each 32 samples per 0.1 s,
  // target 4096: together they reach it within about 0.2 s of their rates being known.
  coordinator c("a", options(4096));
  c.start(0);
  std::vector<progress_entry> first;
  for (int i = 0; i < 63; ++i)
    first.push_back(peer_at("p" + std::to_string(i), 0, 0, 0, 0));
  c.progress_read(first, 0);
  double read_at = -1;
  for (int i = 1; i <= 100 && read_at < 0; ++i) {
    auto t = 0.1 * i;
    if (has<read_progress>(c.samples_done(32, t)))
      read_at = t;
  }
  // Counted at rate 0 the others made the next read 10.5 s away (ETA on the own rate, times
  // 64 / 76.8), long after the collaboration reached the target.
  REQUIRE(read_at > 0);
  CHECK(read_at <= 1.0);
}

TEST_CASE("a departed peer's samples stop counting once its record expires or is withdrawn") {
  coordinator c("a", options(100));
  c.start(0);
  // b claims 10/s; its record expires at t = 5. Alone we do 1/s.
  c.samples_done(1, 1);
  c.progress_read({peer_at("b", 0, 0, 10, 0, false, 5)}, 1);
  auto before = c.estimate(4.9);
  CHECK(before.rate > 10);
  auto after = c.estimate(5);
  CHECK(after.rate < 10);
  CHECK(after.peers == 1);
  // A tombstone in the next read drops it at once.
  progress_record tomb{"b", 0, 0, 0, 2, false, true};
  c.progress_read({peer_at("c", 0, 0, 3, 2), {"b", encode_progress(tomb), 60}}, 2);
  CHECK(c.estimate(2).peers == 2);
  // And the owner can tell the core that a peer left.
  c.peer_left("c", 2);
  CHECK(c.estimate(2).peers == 1);
}

TEST_CASE("a step starts when the ETA of the last read has passed") {
  coordinator c("a", options(100));
  c.start(0);
  c.samples_done(10, 1); // 10/s
  auto es = c.progress_read({peer_at("b", 0, 0, 10, 1)}, 1);
  // 10 + 0 at t = 1, 20/s: 90 left, ETA 4.5 s.
  auto e = c.estimate(1);
  CHECK(e.eta == doctest::Approx(4.5));
  // Refresh at 1 + 4.5·2/5 = 2.8 comes first; then the ETA.
  CHECK(one<wake_at>(es).at == doctest::Approx(2.8));
  // Our own samples did not come as fast as predicted (still 10), but the ETA has passed.
  // (The rate EMA may land a rounding error off 10/s, hence a little past 5.5 s.)
  es = c.timer(5.5 + 1e-9);
  CHECK(has<start_round>(es));
  CHECK(one<start_round>(es).samples == 10);
}

TEST_CASE("after an averaged step the peers of the round are presumed at the new step") {
  coordinator c("a", options(100));
  c.start(0);
  c.samples_done(10, 1); // 10/s
  // b and c at 30/s and 60/s: 10 + 50 + 40 = 100, the round starts at the read.
  auto r = one<start_round>(
    c.progress_read({peer_at("b", 0, 50, 30, 1), peer_at("c", 0, 40, 60, 1)}, 1));
  auto es = c.round_done(r.id, 3);
  CHECK(c.step() == 1);
  CHECK(has<read_progress>(es));
  // Without waiting for that read: three peers at 100/s from t = 3, the ETA 1 s away.
  auto e = c.estimate(3);
  CHECK(e.peers == 3);
  CHECK(e.samples == doctest::Approx(0));
  CHECK(e.eta == doctest::Approx(1));
  CHECK(all<wake_at>(es).back().at == doctest::Approx(4));
  // The read returns b's and c's records from before the step (their new ones are still being
  // stored): the presumption stays.
  c.progress_read({peer_at("b", 0, 50, 30, 1), peer_at("c", 0, 40, 60, 1)}, 3.2);
  CHECK(c.estimate(3.2).peers == 3);
  CHECK(c.estimate(3.2).behind == 0);
  // (The read moved the ETA to 3.2 + 82/100: its extrapolation counts no own samples yet.)
  c.samples_done(5, 3.5);
  CHECK_FALSE(has<start_round>(c.timer(4)));
  es = c.timer(4.02 + 1e-9);
  auto next = one<start_round>(es);
  CHECK(next.step == 1);
  CHECK(next.samples == 5);
  es = c.round_done(next.id, 5);
  CHECK(c.step() == 2);
  // A record made after the step replaces the presumption: c did not step (it is behind), b's
  // new record at step 2 counts as read.
  c.progress_read({peer_at("b", 2, 20, 30, 5.5), peer_at("c", 1, 0, 60, 5.2)}, 5.5);
  e = c.estimate(5.5);
  CHECK(e.peers == 2);
  CHECK(e.behind == 1);
  CHECK(e.samples == doctest::Approx(20));
  // A failed round presumes nothing: the next decision waits for a read.
  es = c.timer(6);
  r = one<start_round>(c.samples_done(100, 6));
  es = c.round_failed(r.id, 7);
  CHECK(has<step_own>(es));
  CHECK_FALSE(has<start_round>(c.timer(100)));
  check_accounting(c);
}

TEST_CASE("a round whose group was smaller than the step's peers presumes nobody") {
  // 64 peers once: two of them finished a round of their own and presumed the other 62 at the
  // next step with their rates, so the pair's estimate reached the target at once and the two
  // took step after step on a microbatch each while the others fell behind.
  auto run = [](size_t group) {
    coordinator c("a", options(100));
    c.start(0);
    c.samples_done(10, 1);
    auto r = one<start_round>(
      c.progress_read({peer_at("b", 0, 50, 30, 1), peer_at("c", 0, 40, 60, 1)}, 1));
    c.round_done(r.id, 3, group);
    REQUIRE(c.step() == 1);
    return c.estimate(3).peers;
  };
  CHECK(run(0) == 3); // the owner gave no size: presumed as before
  CHECK(run(3) == 3); // the whole step averaged
  CHECK(run(2) == 1); // only a pair: nobody presumed, the next read decides
}

TEST_CASE("no sample is counted twice") {
  auto o = options(100);
  o.delay_updates = true;
  coordinator c("a", o);
  std::mt19937_64 gen(11);
  std::uniform_int_distribution<int> batch(1, 16), outcome(0, 3);
  c.start(0);
  uint64_t in_rounds = 0, dropped_by_downloads = 0;
  std::vector<start_round> rounds;
  double t = 0;
  for (int i = 0; i < 400; ++i) {
    t += 0.25;
    std::vector<effect> es = c.samples_done(static_cast<uint64_t>(batch(gen)), t);
    if (i % 5 == 0) {
      // "b" at our step: half the time it asks for a resync too (it stepped alone as well),
      // else it and "c" took the update and a peer that stepped alone downloads their state.
      auto b = peer_at("b", c.step(), 40, 20, t);
      if (outcome(gen) < 2) {
        progress_record r{"b", c.step(), 40, 20, t, false, false};
        r.resync = true;
        b.value = encode_progress(r);
      }
      std::vector<progress_entry> read{b};
      if (b.value == peer_at("b", c.step(), 40, 20, t).value)
        read.push_back(peer_at("c", c.step(), 40, 20, t)); // two in sync outnumber a lone one
      auto more = c.progress_read(read, t);
      es.insert(es.end(), more.begin(), more.end());
    }
    for (auto& d : all<download_state>(es)) {
      auto before = c.stats().samples_dropped;
      std::vector<effect> ends = outcome(gen) == 0 ? c.download_failed(d.id, t)
                                                   : c.download_done(d.id, d.step, t);
      dropped_by_downloads += c.stats().samples_dropped - before; // pending, never in a round
      es.insert(es.end(), ends.begin(), ends.end());
    }
    for (auto& r : all<start_round>(es)) {
      rounds.push_back(r);
      in_rounds += r.samples;
    }
    if (c.phase() == coordinator_phase::averaging && i % 3 == 0) {
      auto id = rounds.back().id;
      std::vector<effect> ends;
      switch (outcome(gen)) {
      case 0:
        ends = c.round_failed(id, t);
        break;
      case 1:
        t += 31; // the deadline passes
        ends = c.timer(t);
        break;
      default:
        ends = c.round_done(id, t);
      }
      // A duplicate answer is ignored.
      CHECK(c.round_done(id, t).empty());
      // Resyncs after lone steps: loaded or failed at once.
      for (auto& sr : all<start_state_round>(ends)) {
        if (outcome(gen) == 0)
          c.state_round_failed(sr.id, t);
        else
          c.state_round_done(sr.id, t);
      }
    }
    check_accounting(c);
  }
  const auto& s = c.stats();
  CHECK(s.rounds > 10);
  CHECK(s.rounds_averaged > 0);
  CHECK(s.own_steps > 0);
  CHECK(s.resyncs > 0);
  CHECK(s.resync_downloads > 0);
  // What went into rounds was counted once, in exactly one of the round outcomes.
  CHECK(in_rounds ==
        s.samples_averaged + s.samples_alone + c.round_samples() +
                        (s.samples_dropped - dropped_by_downloads));
  CHECK(s.samples_stale > 0);
}

TEST_CASE("delayed parameter updates keep computing while the round runs") {
  auto o = options(100);
  o.delay_updates = true;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  auto es = c.samples_done(10, 1);
  auto r = one<start_round>(es);
  CHECK_FALSE(has<pause_compute>(es));
  CHECK(c.update_in_flight());
  // Step 1's samples are computed on parameters that do not have step 0's update yet.
  c.samples_done(7, 1.5);
  CHECK(c.stats().samples_stale == 7);
  CHECK(c.pending_samples() == 7);
  es = c.round_done(r.id, 2);
  CHECK(has<apply_averaged>(es));
  CHECK_FALSE(has<resume_compute>(es));
  CHECK_FALSE(c.update_in_flight());
  CHECK(c.step() == 1);
  // They count towards step 1.
  CHECK(decode_progress(one<publish_progress>(es).value)->samples == 7);
  check_accounting(c);
}

TEST_CASE("without delayed updates, samples that were in flight count towards the next step") {
  coordinator c("a", options(100));
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(10, 1));
  CHECK_FALSE(c.update_in_flight());
  c.samples_done(3, 1.1); // a microbatch that was already running
  c.round_done(r.id, 2);
  CHECK(c.pending_samples() == 3);
  check_accounting(c);
}

TEST_CASE("parameters and optimizer statistics are averaged every K steps") {
  auto o = options(100);
  o.average_state_every = 2;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 99, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(1, 1));
  auto es = c.round_done(r.id, 1);
  CHECK_FALSE(has<start_state_round>(es));
  c.progress_read({peer_at("b", 1, 99, 0, 1)}, 1);
  r = one<start_round>(c.samples_done(1, 2));
  es = c.round_done(r.id, 2);
  auto sr = one<start_state_round>(es);
  CHECK(sr.step == 2);
  CHECK(c.phase() == coordinator_phase::state_averaging);
  // Reads go on, but no gradient round starts until the state round ends.
  es = c.progress_read({peer_at("b", 2, 200, 0, 2)}, 2);
  CHECK_FALSE(has<start_round>(es));
  es = c.state_round_done(sr.id, 3);
  CHECK(one<load_averaged_state>(es).id == sr.id);
  CHECK(has<start_round>(es));
  CHECK(c.stats().state_rounds_loaded == 1);
}

TEST_CASE("a state round that never ends is abandoned at its deadline, keeping the own state") {
  auto o = options(100);
  o.average_state_every = 1;
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 99, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(1, 1));
  auto sr = one<start_state_round>(c.round_done(r.id, 1));
  auto es = c.timer(sr.deadline);
  CHECK(one<abandon_state_round>(es).id == sr.id);
  CHECK_FALSE(has<load_averaged_state>(es));
  CHECK(c.stats().state_rounds_failed == 1);
  CHECK(c.state_round_done(sr.id, sr.deadline + 1).empty());
}

namespace {

/// A peer "a" at step 0 with "b" about to reach the target: its next 20 samples start a round.
coordinator at_first_round(coordinator_options o) {
  coordinator c("a", o);
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  return c;
}

/// Reads "b" at the peer's step with 90 samples (asking for a resync when `b_resync`: it
/// stepped alone too), reports 20 samples at `t`: the round started.
start_round next_round(coordinator& c, seconds t, std::vector<progress_entry> more = {},
                       bool b_resync = false) {
  progress_record b{"b", c.step(), 90, 0, t, false, false};
  b.resync = b_resync;
  more.push_back({"b", encode_progress(b), 1e9});
  c.progress_read(more, t);
  return one<start_round>(c.samples_done(20, t));
}

progress_entry resync_asked(const std::string& id, uint64_t step, seconds t) {
  progress_record r{id, step, 0, 0, t, false, false};
  r.resync = true;
  return {id, encode_progress(r), 1e9};
}

} // namespace

TEST_CASE("after a lone step the next update is followed by a state round without periodic "
          "averaging") {
  auto o = options(100);
  REQUIRE(o.average_state_every == 0);
  REQUIRE(o.resync_after_lone_step); // the default
  bool deadline = false;
  SUBCASE("the round failed") {}
  SUBCASE("the round was abandoned at its deadline") {
    deadline = true;
  }
  auto c = at_first_round(o);
  auto r = one<start_round>(c.samples_done(20, 1));
  auto es = deadline ? c.timer(r.deadline) : c.round_failed(r.id, 2);
  auto now = deadline ? r.deadline : 2.0;
  CHECK(has<step_own>(es));
  // Not at once: the others learn from the flagged record and join after the next update.
  CHECK_FALSE(has<start_state_round>(es));
  CHECK(c.resync_due());
  auto rec = decode_progress(one<publish_progress>(es).value);
  REQUIRE(rec.ok());
  CHECK(rec->step == 1);
  CHECK(rec->resync);
  r = next_round(c, now + 1, {}, true); // "b" stepped alone too
  CHECK(r.step == 1);
  CHECK(decode_progress(encode_progress(c.own_record(now + 1)))->resync); // still asking
  es = c.round_done(r.id, now + 2);
  CHECK(has<apply_averaged>(es));
  auto sr = one<start_state_round>(es);
  CHECK(sr.step == 2);
  CHECK(sr.resync);
  CHECK(c.phase() == coordinator_phase::state_averaging);
  CHECK_FALSE(c.resync_due());
  CHECK_FALSE(c.own_record(now + 2).resync);
  es = c.state_round_done(sr.id, now + 3);
  CHECK(one<load_averaged_state>(es).id == sr.id);
  CHECK(c.stats().resyncs == 1);
  CHECK(c.stats().resyncs_failed == 0);
  CHECK(c.stats().state_rounds == 1);
  // In sync again: later updates bring no state round.
  r = next_round(c, now + 4);
  CHECK_FALSE(has<start_state_round>(c.round_done(r.id, now + 5)));
  check_accounting(c);
}

TEST_CASE("a peer that stepped alone downloads the state of peers at its step that did not") {
  // A newcomer's first round missed the group (it re-formed before the newcomer asked), or this
  // peer's round alone failed: the others took the averaged update, so their state is the
  // collaboration's and this peer takes it instead of asking them for a state round.
  auto c = at_first_round(options(100));
  auto r = one<start_round>(c.samples_done(20, 1));
  auto es = c.round_failed(r.id, 2);
  CHECK(has<step_own>(es));
  CHECK(c.resync_due());
  REQUIRE(c.step() == 1);
  // At step 1: a client (no donor), a peer that stepped alone too, a peer still at step 0.
  es = c.progress_read({peer_at("k", 1, 10, 5, 2, true), resync_asked("l", 1, 2),
                        peer_at("m", 0, 10, 5, 2)},
                       2);
  CHECK_FALSE(has<download_state>(es));
  CHECK(c.phase() == coordinator_phase::accumulating);
  // "b" took step 0's averaged update: it is at step 1 and asks for nothing. But as many at
  // step 1 stepped alone ("l" and this peer): a state round, not a download, brings them back.
  es = c.progress_read({peer_at("b", 1, 10, 5, 3), peer_at("k", 1, 10, 5, 3, true),
                        resync_asked("l", 1, 3)},
                       3);
  CHECK_FALSE(has<download_state>(es));
  // "d" too: those that stayed together are the most; the client "k" counts but serves nothing.
  es = c.progress_read({peer_at("b", 1, 10, 5, 3), peer_at("k", 1, 10, 5, 3, true),
                        peer_at("d", 1, 10, 5, 3), resync_asked("l", 1, 3)},
                       3);
  auto d = one<download_state>(es);
  CHECK(d.step == 1);
  CHECK(d.donors == std::vector<std::string>{"b", "d"});
  CHECK(d.resync);
  CHECK(has<pause_compute>(es));
  CHECK(c.phase() == coordinator_phase::downloading);
  CHECK(c.stats().resync_downloads == 1);
  c.samples_done(5, 3.5);
  es = c.download_done(d.id, 1, 4);
  CHECK(has<discard_gradients>(es));
  CHECK_FALSE(c.resync_due());
  CHECK_FALSE(c.own_record(4).resync);
  // In sync again: the next update brings no state round.
  r = next_round(c, 5);
  CHECK(r.step == 1);
  CHECK_FALSE(has<start_state_round>(c.round_done(r.id, 6)));
  CHECK(c.stats().state_rounds == 0);
  check_accounting(c);
  // Without resync_by_download the same read brings no download.
  auto o = options(100);
  o.resync_by_download = false;
  auto x = at_first_round(o);
  r = one<start_round>(x.samples_done(20, 1));
  CHECK(has<step_own>(x.round_failed(r.id, 2)));
  CHECK_FALSE(has<download_state>(
    x.progress_read({peer_at("b", 1, 10, 5, 3), peer_at("d", 1, 10, 5, 3)}, 3)));
  CHECK(x.resync_due());
}

TEST_CASE("with resync after a lone step off, a lone step brings no state round") {
  auto o = options(100);
  o.resync_after_lone_step = false;
  auto c = at_first_round(o);
  auto r = one<start_round>(c.samples_done(20, 1));
  auto es = c.round_failed(r.id, 2);
  CHECK(has<step_own>(es));
  CHECK_FALSE(c.resync_due());
  CHECK_FALSE(decode_progress(one<publish_progress>(es).value)->resync);
  for (int i = 0; i < 3; ++i) {
    r = next_round(c, 3 + 2 * i);
    CHECK_FALSE(has<start_state_round>(c.round_done(r.id, 4 + 2 * i)));
  }
  // A peer asking for a resync is not joined either.
  r = next_round(c, 10, {resync_asked("c", c.step(), 10)});
  CHECK_FALSE(has<start_state_round>(c.round_done(r.id, 11)));
  CHECK(c.stats().state_rounds == 0);
  CHECK(c.stats().resyncs == 0);
}

TEST_CASE("successful rounds bring no resync") {
  auto c = at_first_round(options(100));
  auto r = one<start_round>(c.samples_done(20, 1));
  for (int i = 0; i < 4; ++i) {
    auto es = c.round_done(r.id, 2 + 2 * i);
    CHECK(has<apply_averaged>(es));
    CHECK_FALSE(has<start_state_round>(es));
    CHECK_FALSE(c.resync_due());
    r = next_round(c, 3 + 2 * i);
  }
  CHECK(c.stats().state_rounds == 0);
  // A skipped step (no own samples) is no lone step either.
  auto s = coordinator("s", options(100));
  s.start(0);
  auto z = one<start_round>(s.progress_read({peer_at("b", 0, 100, 0, 0)}, 0));
  CHECK(has<skip_step>(s.round_failed(z.id, 1)));
  CHECK_FALSE(s.resync_due());
}

TEST_CASE("a failed resync is tried once more after the next update, then given up") {
  auto c = at_first_round(options(100));
  auto r = one<start_round>(c.samples_done(20, 1));
  c.round_failed(r.id, 2);
  r = next_round(c, 3, {}, true);
  auto sr = one<start_state_round>(c.round_done(r.id, 4));
  // The resync finds nobody: no new state round at once, back to accumulating.
  auto es = c.state_round_failed(sr.id, 5);
  CHECK_FALSE(has<start_state_round>(es));
  CHECK(c.phase() == coordinator_phase::accumulating);
  CHECK(c.resync_due());
  // The retry follows the next update ("b" failed its resync too); it times out.
  r = next_round(c, 6, {}, true);
  auto retry = one<start_state_round>(c.round_done(r.id, 7));
  CHECK(retry.resync);
  CHECK(retry.id != sr.id);
  es = c.timer(retry.deadline);
  CHECK(one<abandon_state_round>(es).id == retry.id);
  CHECK_FALSE(has<start_state_round>(es));
  CHECK_FALSE(c.resync_due());
  // The step's ETA, predicted from the peers' rates when the update came, passed during the
  // state round: the next round starts at once.
  r = one<start_round>(es);
  // Given up: later updates bring no state round, and late answers are ignored.
  auto t = retry.deadline + 1;
  for (int i = 0; i < 5; ++i, t += 2) {
    es = c.round_done(r.id, t);
    CHECK(has<apply_averaged>(es));
    CHECK_FALSE(has<start_state_round>(es));
    r = next_round(c, t + 1);
  }
  CHECK(c.state_round_failed(retry.id, t).empty());
  CHECK(c.stats().resyncs == 2);
  CHECK(c.stats().resyncs_failed == 2);
  CHECK(c.stats().state_rounds == 2);
  check_accounting(c);
}

TEST_CASE("a peer in sync joins the resync a peer at its step asks for") {
  auto c = at_first_round(options(100));
  auto r = one<start_round>(c.samples_done(20, 1));
  c.round_done(r.id, 2);
  // "c" stepped alone to step 1; "d", behind, asks at a step that is not ours.
  r = next_round(c, 3, {resync_asked("c", 1, 3), resync_asked("d", 0, 3)});
  auto sr = one<start_state_round>(c.round_done(r.id, 4));
  CHECK(sr.step == 2);
  CHECK(sr.resync);
  CHECK(c.state_round_done(sr.id, 5).size() > 0);
  // Only the flag at our step counts.
  r = next_round(c, 6, {resync_asked("d", 1, 6)});
  CHECK_FALSE(has<start_state_round>(c.round_done(r.id, 7)));
  CHECK(c.stats().resyncs == 1);
}

TEST_CASE("leaving withdraws the record and abandons the round in flight") {
  coordinator c("a", options(100));
  c.start(0);
  c.progress_read({peer_at("b", 0, 90, 0, 0)}, 0);
  auto r = one<start_round>(c.samples_done(10, 1));
  c.samples_done(4, 1.5);
  auto es = c.leave(2);
  CHECK(one<abandon_round>(es).id == r.id);
  auto w = one<withdraw_progress>(es);
  auto rec = decode_progress(w.value);
  REQUIRE(rec.ok());
  CHECK(rec->withdrawn);
  CHECK(rec->peer == "a");
  CHECK(w.expires_at == 2 + c.options().progress.record_lifetime);
  CHECK(c.phase() == coordinator_phase::left);
  // Nothing happens after leaving, and what was accumulated is accounted as dropped.
  CHECK(c.round_done(r.id, 3).empty());
  CHECK(c.timer(100).empty());
  c.samples_done(5, 4);
  CHECK(c.stats().samples_dropped == 19);
  check_accounting(c);
}

TEST_CASE("an auxiliary peer averages with weight 0 and holds no model state") {
  auto o = options(100);
  o.mode = peer_mode::auxiliary;
  coordinator c("aux", o);
  c.start(0);
  auto rec = c.own_record(0);
  CHECK(rec.samples == 0);
  CHECK(rec.rate == 0.0);
  // Samples reported by mistake count for nothing.
  c.samples_done(50, 1);
  CHECK(c.pending_samples() == 0);
  auto es = c.progress_read({peer_at("b", 0, 100, 0, 1)}, 1);
  auto r = one<start_round>(es);
  CHECK(r.samples == 0);
  CHECK_FALSE(has<pause_compute>(es));
  es = c.round_done(r.id, 2);
  CHECK_FALSE(has<apply_averaged>(es));
  CHECK(c.step() == 1);
  // Ahead peers: it just stands where the collaboration stands, no download.
  es = c.progress_read({peer_at("b", 7, 0, 1, 3)}, 3);
  CHECK_FALSE(has<download_state>(es));
  CHECK(c.step() == 7);
  check_accounting(c);
}

TEST_CASE("a client-mode peer says so in its record") {
  auto o = options(100);
  o.mode = peer_mode::client;
  coordinator c("cl", o);
  auto es = c.start(0);
  CHECK(decode_progress(one<publish_progress>(es).value)->client_mode);
}

TEST_CASE("a progress read that never answers is given up at its deadline and asked again") {
  auto o = options(100);
  coordinator c("a", o);
  c.start(0);
  auto es = c.timer(o.read_timeout);
  CHECK(has<read_progress>(es));
  CHECK(c.stats().reads_failed == 1);
  es = c.progress_read_failed(o.read_timeout + 1);
  CHECK(c.stats().reads_failed == 2);
  CHECK_FALSE(has<read_progress>(es));
  CHECK(one<wake_at>(es).at == 2 * o.read_timeout + 1);
}

TEST_CASE("malformed and mismatched records in a read are counted and ignored") {
  coordinator c("a", options(100));
  c.start(0);
  auto es = c.progress_read({{"x", {'b', 'a', 'd'}, 60}, peer_at("b", 0, 500, 0, 0)}, 0);
  CHECK(c.stats().records_rejected == 1);
  CHECK(has<start_round>(es)); // b's valid record still counts
  progress_entry forged = peer_at("b", 0, 500, 0, 0);
  forged.subkey = "mallory";
  coordinator d("a", options(100));
  d.start(0);
  es = d.progress_read({forged}, 0);
  CHECK(d.stats().records_rejected == 1);
  CHECK_FALSE(has<start_round>(es));
}

TEST_CASE("after a round without own samples fails, no new round at that step rests on "
          "extrapolated rates alone") {
  // Two stage peers whose trainers stopped: each presumed the other at work at its last rate,
  // and they stepped on empty rounds again and again until the rates went to 0.
  auto failed_once = [] {
    auto c = std::make_unique<coordinator>("a", options(100));
    c->start(0);
    // b has nothing yet but goes at 50/s: the target by t = 2 on its rate alone.
    c->progress_read({peer_at("b", 0, 0, 50, 0)}, 0);
    auto r = one<start_round>(c->timer(2));
    CHECK(r.samples == 0);
    CHECK(one<skip_step>(c->round_failed(r.id, 2.5)).step == 0);
    CHECK(c->step() == 0);
    // The next read shows b as before: no samples, the same rate.
    c->progress_read({peer_at("b", 0, 0, 50, 2.5)}, 2.6);
    for (seconds t = 3; t < 20; t += 0.5)
      CHECK_FALSE(has<start_round>(c->timer(t)));
    return c;
  };
  SUBCASE("own samples end the wait") {
    auto c = failed_once();
    auto r = one<start_round>(c->samples_done(5, 20));
    CHECK(r.step == 0);
    CHECK(r.samples == 5);
  }
  SUBCASE("a read that shows samples ends the wait") {
    auto c = failed_once();
    auto r = one<start_round>(c->progress_read({peer_at("b", 0, 100, 50, 20)}, 20));
    CHECK(r.step == 0);
    CHECK(r.samples == 0);
  }
  SUBCASE("a peer with own samples in its failed round steps alone and does not wait") {
    coordinator c("a", options(100));
    c.start(0);
    c.samples_done(1, 0);
    c.samples_done(1, 1); // 1/s
    c.progress_read({peer_at("b", 0, 0, 50, 0)}, 1);
    auto r = one<start_round>(c.timer(2.1));
    CHECK(r.samples == 2);
    CHECK(has<step_own>(c.round_failed(r.id, 2.5)));
    c.progress_read({peer_at("b", 1, 0, 50, 2.5)}, 2.6);
    bool started = false;
    for (seconds t = 3; t < 6 && !started; t += 0.5)
      started = has<start_round>(c.timer(t));
    CHECK(started);
  }
}

} // namespace starling::test::actors_coordinator_test
