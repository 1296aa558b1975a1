// Averager matchmaking without actors: matchmakers exchange their effects over a simulated DHT
// (each peer's polls reveal the others' announcements in an order the test chooses) and a
// network with seeded latencies.
#include "actors/averager/matchmaker.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <random>

namespace starling::test::actors_matchmaker_test {

using namespace starling;
using namespace starling::actors::averager;
using namespace std::chrono_literals;

namespace {

using nanos = std::chrono::nanoseconds;

struct outcome {
  bool formed = false;
  uint64_t group_id = 0;
  std::vector<std::string> members;
  std::string why;
  nanos at{0};
};

/// Peers named "p0" < "p1" < ... with matchmakers, a DHT and a network.
class mm_net {
public:
  mm_net(size_t n, uint64_t seed, matchmaker_options base = {})
      : rng_(seed),
        reveal_(n),
        revealed_(n, 0),
        started_(n, nanos{0}),
        dead_(n, false),
        outcomes_(n),
        joins_to_(n, 0) {
    if (base.target_group_size == 16)
      base.target_group_size = static_cast<uint32_t>(n);
    for (size_t i = 0; i < n; ++i) {
      auto o = base;
      o.address = name(i);
      mms_.emplace_back(o);
      for (size_t j = 0; j < n; ++j)
        if (j != i)
          reveal_[i].push_back(j);
    }
    opts_ = base;
  }

  static std::string name(size_t i) { return "p" + std::to_string(i); }
  static size_t index(const std::string& s) { return std::stoul(s.substr(1)); }

  /// Peer i's polls reveal the others' announcements in this order, one more per poll.
  void reveal(size_t i, std::vector<size_t> order) { reveal_[i] = std::move(order); }
  /// Peer i's polls show everything at once.
  void reveal_all(size_t i) { revealed_[i] = reveal_[i].size(); }

  /// Starts a request of peer i at time t.
  void start(size_t i, nanos t, const std::string& key = "g", int64_t numel = 100) {
    at(t, [this, i, key, numel] {
      started_[i] = now_;
      outcomes_[i].reset();
      apply(i, mms_[i].start(key, numel, now_.count(), i));
    });
  }
  /// Ends peer i's request at time t (after its round, or to cancel), remembering `members`.
  void finish(size_t i, nanos t, bool remember) {
    at(t, [this, i, remember] {
      std::vector<messages::member_info> ms;
      if (remember && outcomes_[i] && outcomes_[i]->formed)
        for (auto& m : outcomes_[i]->members)
          ms.push_back({m, 1.0, false});
      apply(i, mms_[i].finish(std::move(ms)));
    });
  }
  /// Peer i stops answering anything from time t on.
  void kill(size_t i, nanos t) {
    at(t, [this, i] { dead_[i] = true; });
  }

  void run(nanos until = 60s) {
    while (!events_.empty() && events_.top().t <= until) {
      auto ev = events_.top();
      events_.pop();
      now_ = ev.t;
      ev.fn();
    }
  }

  const std::optional<outcome>& result(size_t i) const { return outcomes_[i]; }
  nanos started(size_t i) const { return started_[i]; }
  /// Joins peer i received so far.
  size_t joins_to(size_t i) const { return joins_to_[i]; }
  nanos latency() const { return 5ms; }

private:
  struct event {
    nanos t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator<(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };

  void at(nanos t, std::function<void()> fn) { events_.push({t, seq_++, std::move(fn)}); }

  nanos hop() { return 1ms + nanos{static_cast<int64_t>(rng_() % 9'000'000)}; }

  /// Runs `fn` at peer i after one network hop, unless it is dead then.
  void deliver(size_t i, std::function<void()> fn) {
    at(now_ + hop(), [this, i, fn = std::move(fn)] {
      if (!dead_[i])
        fn();
    });
  }

  void apply(size_t i, std::vector<mm_effect> effects) {
    if (dead_[i])
      return;
    for (auto& e : effects) {
      if (auto* a = std::get_if<mm::announce>(&e)) {
        dht_[name(i)] = announcement{name(i), a->value, (now_ + a->ttl).count()};
      } else if (std::get_if<mm::poll>(&e)) {
        deliver(i, [this, i] {
          std::vector<announcement> recs;
          revealed_[i] = std::min(revealed_[i] + 1, reveal_[i].size());
          for (size_t k = 0; k < revealed_[i]; ++k)
            if (auto it = dht_.find(name(reveal_[i][k]));
                it != dht_.end() && it->second.expiration_ns > now_.count())
              recs.push_back(it->second);
          apply(i, mms_[i].on_records(recs));
        });
      } else if (auto* j = std::get_if<mm::send_join>(&e)) {
        auto to = index(j->to);
        auto ticket = next_ticket_++;
        tickets_[ticket] = {i, j->epoch, j->to};
        auto join = j->join;
        deliver(to, [this, to, ticket, join] {
          ++joins_to_[to];
          apply(to, mms_[to].on_join(ticket, join));
        });
        // The request's timeout (rpc_timeout, 2 s) when nobody answers.
        at(now_ + 2s, [this, ticket] {
          auto it = tickets_.find(ticket);
          if (it == tickets_.end())
            return;
          auto [from, epoch, leader] = it->second;
          tickets_.erase(it);
          if (!dead_[from])
            apply(from, mms_[from].on_join_failed(epoch, leader, "request timeout"));
        });
      } else if (auto* a = std::get_if<mm::answer_join>(&e)) {
        auto it = tickets_.find(a->ticket);
        if (it == tickets_.end())
          continue; // timed out already
        auto [from, epoch, leader] = it->second;
        tickets_.erase(it);
        auto reply = a->reply;
        deliver(from, [this, from, epoch = epoch, leader = leader, reply] {
          apply(from, mms_[from].on_join_reply(epoch, leader, reply));
        });
      } else if (auto* l = std::get_if<mm::send_leave>(&e)) {
        auto to = index(l->to);
        auto leave = l->leave;
        deliver(to, [this, to, leave] { apply(to, mms_[to].on_leave(leave)); });
      } else if (auto* g = std::get_if<mm::send_group>(&e)) {
        auto to = index(g->to);
        auto group = g->group;
        deliver(to, [this, to, group] { apply(to, mms_[to].on_group(group)); });
      } else if (auto* t = std::get_if<mm::set_timer>(&e)) {
        auto epoch = t->epoch;
        auto kind = t->kind;
        at(now_ + t->delay, [this, i, epoch, kind] {
          if (!dead_[i])
            apply(i, mms_[i].on_timer(epoch, kind));
        });
      } else if (auto* f = std::get_if<mm::formed>(&e)) {
        outcome o;
        o.formed = true;
        o.group_id = f->group_id;
        for (auto& m : f->members)
          o.members.push_back(m.address);
        o.at = now_;
        outcomes_[i] = o;
      } else if (auto* g = std::get_if<mm::gave_up>(&e)) {
        outcome o;
        o.why = g->why;
        o.at = now_;
        outcomes_[i] = o;
      }
    }
  }

  std::mt19937_64 rng_;
  matchmaker_options opts_;
  std::vector<matchmaker> mms_;
  std::vector<std::vector<size_t>> reveal_;
  std::vector<size_t> revealed_;
  std::vector<nanos> started_;
  std::vector<bool> dead_;
  std::vector<std::optional<outcome>> outcomes_;
  std::vector<size_t> joins_to_;
  std::map<std::string, announcement> dht_;
  struct ticket_info {
    size_t from;
    uint64_t epoch;
    std::string leader;
  };
  std::map<uint64_t, ticket_info> tickets_;
  uint64_t next_ticket_ = 1;
  std::priority_queue<event> events_;
  uint64_t seq_ = 0;
  nanos now_{0};
};

std::vector<std::string> names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(mm_net::name(i));
  return out;
}

} // namespace

TEST_CASE("matchmaking converges on one leader under every order of record arrival") {
  // 4 peers; each sees the other three announcements in one of 6 orders: all 6^4 combinations,
  // with seeded latencies and start times.
  std::vector<std::vector<size_t>> perms;
  std::vector<size_t> base = {0, 1, 2};
  do
    perms.push_back(base);
  while (std::next_permutation(base.begin(), base.end()));
  size_t combos = 0;
  for (size_t a = 0; a < 6; ++a)
    for (size_t b = 0; b < 6; ++b)
      for (size_t c = 0; c < 6; ++c)
        for (size_t d = 0; d < 6; ++d) {
          std::array<size_t, 4> pick = {a, b, c, d};
          mm_net net(4, ++combos);
          for (size_t i = 0; i < 4; ++i) {
            std::vector<size_t> order;
            for (auto k : perms[pick[i]])
              order.push_back(k < i ? k : k + 1); // the others, in the chosen order
            net.reveal(i, order);
            net.start(i, std::chrono::milliseconds(combos * 7 % 90 + 10 * i));
          }
          net.run();
          CAPTURE(combos);
          for (size_t i = 0; i < 4; ++i) {
            REQUIRE(net.result(i));
            CHECK(net.result(i)->formed);
            CHECK(net.result(i)->members == names(4));
            CHECK(net.result(i)->group_id == net.result(0)->group_id);
          }
        }
  CHECK(combos == 1296);
}

TEST_CASE("a refusal holds until the leader announces itself anew") {
  matchmaker_options o;
  o.persistent_groups = false;
  mm_net net(2, 1, o);
  net.reveal_all(1);
  // p0 announces (a request under "g" that ends at once: its record stays in the DHT), then is
  // busy until t = 1.5 s; p1 starts at 0.2 s, sees p0's old record and asks it: refused.
  net.start(0, 0ms);
  net.finish(0, 1ms, false);
  net.start(1, 200ms);
  net.run(1400ms);
  CHECK(net.joins_to(0) == 1); // asked once, not at every poll
  CHECK_FALSE(net.result(1));
  // p0 starts again: a new announcement, so p1 asks again and the group forms.
  net.start(0, 1500ms);
  net.run();
  CHECK(net.joins_to(0) == 2);
  REQUIRE(net.result(1));
  CHECK(net.result(1)->formed);
  CHECK(net.result(1)->members == names(2));
  CHECK(net.result(0)->group_id == net.result(1)->group_id);
}

TEST_CASE("a persistent group re-forms at once when everyone is back, and without a member "
          "that left") {
  matchmaker_options o;
  o.target_group_size = 8; // only persistence closes a group before the window ends
  mm_net net(3, 5, o);
  for (size_t i = 0; i < 3; ++i) {
    net.reveal_all(i);
    net.start(i, std::chrono::milliseconds(10 * i));
  }
  net.run(3s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    REQUIRE(net.result(i)->formed);
  }
  // Round 2 under the same key: the followers end their first round and ask again while p0 still
  // runs it (it has remembered no group yet); their joins wait for p0's own request.
  net.finish(2, 3s, true);
  net.finish(1, 3040ms, true);
  net.finish(0, 3300ms, true);
  net.start(2, 3100ms);
  net.start(1, 3150ms);
  net.start(0, 3300ms);
  net.run(6s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == names(3));
    // Formed well before the window (2 s) ended: no poll or window was waited for.
    CHECK(net.result(i)->at - 3300ms < 100ms);
  }
  // The followers ask again while the leader still runs its round: they wait for its request.
  net.finish(1, 4s, true);
  net.finish(2, 4s, true);
  net.start(1, 4010ms);
  net.start(2, 4020ms);
  net.finish(0, 4500ms, true);
  net.start(0, 4500ms);
  net.run(5500ms);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == names(3));
    CHECK(net.result(i)->at - 4500ms < 100ms);
  }
  // Round 3: p2 left. p0 and p1 wait for it until the window ends, then form without it.
  for (size_t i = 0; i < 3; ++i)
    net.finish(i, 6s, true);
  net.kill(2, 6s);
  net.start(0, 6100ms);
  net.start(1, 6100ms);
  net.run();
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == std::vector<std::string>{"p0", "p1"});
    CHECK(net.result(i)->at - 6100ms >= 2s); // the window
    CHECK(net.result(i)->at - 6100ms <= 2s + 50ms);
  }
}

TEST_CASE("a group persists across the rounds of one key family and waits for a newcomer it "
          "saw announcing") {
  CHECK(group_family("p/grad/17") == "p/grad/");
  CHECK(group_family("s/stage1/step4") == "s/stage1/step");
  CHECK(group_family("g") == "g");
  CHECK(group_family("42") == "");
  matchmaker_options o;
  o.target_group_size = 8; // only persistence closes a group before the window ends
  o.family_groups = true;
  mm_net net(4, 11, o);
  for (size_t i = 0; i < 4; ++i)
    net.reveal_all(i);
  // Round 1 ("c/1"): p0..p2 find each other through the DHT and wait for the window.
  for (size_t i = 0; i < 3; ++i)
    net.start(i, std::chrono::milliseconds(10 * i), "c/1");
  net.run(3s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    REQUIRE(net.result(i)->formed);
    CHECK(net.result(i)->at >= 2s);
  }
  // Round 2 ("c/2", another key of the family): the group re-forms at once.
  for (size_t i = 0; i < 3; ++i) {
    net.finish(i, 3s, true);
    net.start(i, 3s + std::chrono::milliseconds(20 * (2 - i)), "c/2");
  }
  net.run(6s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == names(3));
    CHECK(net.result(i)->at - 3040ms < 100ms);
  }
  // Round 3: p3 comes in. The leader saw it announcing and waits for its join (before the
  // window ends) instead of closing with the old members only.
  for (size_t i = 0; i < 3; ++i) {
    net.finish(i, 6s, true);
    net.start(i, 6s, "c/3");
  }
  net.start(3, 6s, "c/3");
  net.run(9s);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == names(4));
    CHECK(net.result(i)->at - 6s < 1s);
  }
  // Round 4: a member a round ahead ("c/5") is not put into the leader's "c/4" group.
  for (size_t i = 0; i < 4; ++i)
    net.finish(i, 9s, true);
  net.start(3, 9s, "c/5");
  for (size_t i = 0; i < 3; ++i)
    net.start(i, 9010ms, "c/4");
  net.run(15s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == names(3));
  }
  REQUIRE(net.result(3));
  CHECK_FALSE(net.result(3)->formed);
}

namespace {

/// Groups matched anew every round (own_loop --fresh-groups), a 0.5 s window polled 8 times.
matchmaker_options fresh_groups() {
  matchmaker_options o;
  o.persistent_groups = false;
  o.target_group_size = 8;
  o.matchmaking_window = 500ms;
  o.poll_interval = 62500us;
  return o;
}

/// Every peer of `net` sees every announcement.
void reveal_everything(mm_net& net, size_t peers) {
  for (size_t i = 0; i < peers; ++i)
    net.reveal_all(i);
}

} // namespace

TEST_CASE("a peer with the smallest address that starts after the others' last poll of the "
          "window is in their group") {
  // Groups matched anew every step (own_loop --fresh-groups): p1 and p2 match from t = 0; p0, a
  // newcomer with the smallest address, starts 30 ms before their window ends, after their last
  // poll. It leads nobody and cannot join them (a peer follows smaller addresses only): only
  // their polls could find it, and the window ended first. It stepped alone every step, its next
  // request starting again just before theirs ended (seen once in ~25 loaded suite runs).
  auto o = fresh_groups();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    mm_net net(3, seed, o);
    reveal_everything(net, 3);
    net.start(1, 0ms);
    net.start(2, 0ms);
    net.start(0, 470ms);
    net.run();
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      REQUIRE(net.result(i));
      CHECK(net.result(i)->why == "");
      CHECK(net.result(i)->members == names(3));
      CHECK(net.result(i)->group_id == net.result(0)->group_id);
    }
  }
}

TEST_CASE("a peer that asks a leader whose group under the key already closed gives up at once") {
  // The mirror of the case above: p1 starts after p0 and p2 formed their group under a round's
  // key (fresh groups). Its first poll shows p0, which refuses it: too late for this round.
  // Waiting out its window would start its next request as late again (a newcomer in the middle
  // of the addresses stepped alone twice in a row under load); it gives up at once instead.
  // (Under a key that rounds reuse it waits: "a refusal holds until the leader announces itself
  // anew".)
  auto o = fresh_groups();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    mm_net net(3, seed, o);
    reveal_everything(net, 3);
    net.start(0, 0ms, "p/grad/7");
    net.start(2, 0ms, "p/grad/7");
    net.start(1, 600ms, "p/grad/7");
    net.run();
    REQUIRE(net.result(0));
    CHECK(net.result(0)->formed);
    CHECK(net.result(0)->members == std::vector<std::string>{"p0", "p2"});
    REQUIRE(net.result(1));
    CHECK_FALSE(net.result(1)->formed);
    CHECK_MESSAGE(net.result(1)->why.find("late for this round: p0 answered") != std::string::npos,
                  net.result(1)->why);
    CHECK(net.result(1)->at < nanos{600ms + o.matchmaking_window / 2});
  }
}

TEST_CASE("a follower that leaves during matchmaking is not in the group") {
  matchmaker_options o;
  o.target_group_size = 8; // the leader waits for the window
  mm_net net(3, 9, o);
  for (size_t i = 0; i < 3; ++i) {
    net.reveal_all(i);
    net.start(i, 0ms);
  }
  net.finish(2, 400ms, false); // cancels its request: tells its leader
  net.run();
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(net.result(i));
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == std::vector<std::string>{"p0", "p1"});
  }
}

TEST_CASE("a leader that leaves during matchmaking hands its followers on: they form a group "
          "without it at the window's end") {
  // Churn: p0 (the smallest address, so everyone's leader) leaves mid-window. Without a word
  // p1 and p2 waited for its group until the window and the grace ended and gave up, and their
  // peers each stepped alone on their own gradients.
  matchmaker_options o;
  o.target_group_size = 8; // the leader waits for the window
  mm_net net(3, 9, o);
  for (size_t i = 0; i < 3; ++i) {
    net.reveal_all(i);
    net.start(i, 0ms);
  }
  net.finish(0, 400ms, false); // p0's peer left: its request ends
  net.run();
  for (size_t i = 1; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(net.result(i));
    CHECK(net.result(i)->why == "");
    CHECK(net.result(i)->formed);
    CHECK(net.result(i)->members == std::vector<std::string>{"p1", "p2"});
    CHECK(net.result(i)->at <= o.matchmaking_window + 50ms);
  }
}

TEST_CASE("a lone follower whose leader leaves stops waiting for it at the window's end") {
  // p0 leads only p1; when p0 leaves it names p1, which then leads (nobody) and gives up at the
  // window's end instead of waiting out the grace for a group that cannot come.
  matchmaker_options o;
  o.target_group_size = 8;
  mm_net net(2, 5, o);
  for (size_t i = 0; i < 2; ++i) {
    net.reveal_all(i);
    net.start(i, 0ms);
  }
  net.finish(0, 400ms, false);
  net.run();
  REQUIRE(net.result(1));
  CHECK(!net.result(1)->formed);
  CHECK(net.result(1)->at <= o.matchmaking_window + 50ms);
}

TEST_CASE("no peer waits past the window: random starts, orders and dead peers over 300 seeds") {
  const auto window = 2s, grace = 2s;
  size_t formed = 0, alone = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed);
    size_t n = 2 + rng() % 6;
    mm_net net(n, seed);
    std::vector<bool> dead(n, false);
    for (size_t i = 0; i < n; ++i) {
      std::vector<size_t> order;
      for (size_t j = 0; j < n; ++j)
        if (j != i)
          order.push_back(j);
      std::shuffle(order.begin(), order.end(), rng);
      net.reveal(i, order);
      net.start(i, std::chrono::milliseconds(rng() % 1500));
      if (rng() % 5 == 0) { // dies somewhere in its window
        dead[i] = true;
        net.kill(i, std::chrono::milliseconds(rng() % 2500));
      }
    }
    net.run();
    CAPTURE(seed);
    for (size_t i = 0; i < n; ++i) {
      if (dead[i])
        continue;
      CAPTURE(i);
      REQUIRE(net.result(i));
      CHECK(net.result(i)->at - net.started(i) <= window + grace + 20ms);
      if (net.result(i)->formed) {
        ++formed;
        CHECK(std::count(net.result(i)->members.begin(), net.result(i)->members.end(),
                         mm_net::name(i)) == 1);
      } else {
        ++alone;
      }
    }
  }
  MESSAGE("live peers in a group: " << formed << ", without: " << alone);
  CHECK(formed > 10 * alone);
}

TEST_CASE("announcements round trip, malformed ones are refused") {
  double bw = 0;
  bool aux = false;
  int64_t numel = 0;
  REQUIRE(decode_announcement(encode_announcement(2.5, true, 1234), bw, aux, numel));
  CHECK(bw == 2.5);
  CHECK(aux);
  CHECK(numel == 1234);
  auto text = [](const std::string& s) { return std::vector<char>(s.begin(), s.end()); };
  CHECK_FALSE(decode_announcement(text("v2 1 0 5"), bw, aux, numel));
  CHECK_FALSE(decode_announcement(text("v1 -1 0 5"), bw, aux, numel));
  CHECK_FALSE(decode_announcement(text("v1 1 2 5"), bw, aux, numel));
  CHECK_FALSE(decode_announcement(text("v1 nan 0 5"), bw, aux, numel));
  CHECK_FALSE(decode_announcement(text("v1 1 0"), bw, aux, numel));
  CHECK_FALSE(decode_announcement(std::vector<char>(200, '1'), bw, aux, numel));
}

} // namespace starling::test::actors_matchmaker_test
