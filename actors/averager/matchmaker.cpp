#include "actors/averager/matchmaker.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include <fmt/format.h>

namespace starling::actors::averager {

std::vector<char> encode_announcement(double bandwidth, bool auxiliary, int64_t numel) {
  auto s = fmt::format("v1 {} {} {}", bandwidth, auxiliary ? 1 : 0, numel);
  return {s.begin(), s.end()};
}

bool decode_announcement(const std::vector<char>& v, double& bandwidth, bool& auxiliary,
                         int64_t& numel) {
  if (v.size() > 128)
    return false;
  std::istringstream in(std::string(v.begin(), v.end()));
  std::string tag;
  int a = 0;
  if (!(in >> tag >> bandwidth >> a >> numel) || tag != "v1")
    return false;
  auxiliary = a != 0;
  return std::isfinite(bandwidth) && bandwidth >= 0 && numel >= 0 && (a == 0 || a == 1);
}

std::string matchmaker::memory_key(const std::string& key) const {
  return opts_.family_groups ? group_family(key) : key;
}

std::string group_family(const std::string& key) {
  auto end = key.find_last_not_of("0123456789");
  return end == std::string::npos ? std::string{} : key.substr(0, end + 1);
}

namespace {
/// The leader of a formed group: its smallest address that is not a client's (members are sorted
/// by address; clients join any leader, so one may sort first).
const std::string& leader_of(const std::vector<messages::member_info>& members) {
  for (auto& m : members)
    if (m.bandwidth > 0)
      return m.address;
  return members.front().address;
}
} // namespace

matchmaker::matchmaker(matchmaker_options opts) : opts_(std::move(opts)) {}

messages::member_info matchmaker::me() const {
  return {opts_.address, opts_.bandwidth, opts_.auxiliary};
}

std::vector<mm_effect> matchmaker::start(const std::string& group_key, int64_t numel,
                                         int64_t now_ns, uint64_t seed) {
  std::vector<mm_effect> out;
  ++epoch_;
  phase_ = phase::matching;
  key_ = group_key;
  numel_ = numel;
  now_ns_ = now_ns;
  seed_ = seed;
  leader_.clear();
  followers_.clear();
  members_.clear();
  refused_.clear();
  departed_.clear();
  announced_.clear();
  closed_ = false;
  window_over_ = false;
  polled_ = false;
  seen_.clear();
  late_.clear();
  auto key = opts_.key_prefix + key_;
  out.push_back(mm::announce{key, encode_announcement(opts_.bandwidth, opts_.auxiliary, numel_),
                             2 * opts_.matchmaking_window + opts_.join_grace});
  out.push_back(mm::poll{key});
  out.push_back(mm::set_timer{epoch_, mm_timer::poll, opts_.poll_interval});
  out.push_back(mm::set_timer{epoch_, mm_timer::window_end, opts_.matchmaking_window});
  // A remembered group: ask its leader at once instead of waiting for the DHT.
  if (auto prev = previous_.find(memory_key(key_));
      opts_.persistent_groups && prev != previous_.end())
    switch_to(leader_of(prev->second), out);
  // Joins that waited for this request.
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& w : waiting) {
    avg_join_reply r;
    if (w.join.group_key == key_)
      r = decide_join(w.join, out);
    else
      r.reason = "not matchmaking under this key";
    out.push_back(mm::answer_join{w.ticket, std::move(r)});
  }
  return out;
}

std::vector<mm_effect> matchmaker::on_records(const std::vector<announcement>& records) {
  std::vector<mm_effect> out;
  if (phase_ != phase::matching || closed_ || window_over_)
    return out;
  // A refusal holds until the refusing peer announces itself again: a leader still busy with its
  // previous round re-announces when it starts matching (then it is asked again), a full or
  // closed one does not. (Refusals that held for one poll only made all 7 other peers of an
  // 8-peer bench ask a smallest leader stuck in its previous round every poll until the window
  // ended, and nobody averaged.)
  // A client never leads: without a leader it follows the smallest non-client address,
  // whatever its own.
  auto current = leader_.empty() && !client() ? opts_.address : leader_;
  auto best = current;
  bool first_poll = !polled_;
  polled_ = true;
  for (auto& rec : records) {
    if (rec.address.empty() || rec.address == opts_.address)
      continue;
    double bw = 0;
    bool aux = false;
    int64_t numel = 0;
    if (!decode_announcement(rec.value, bw, aux, numel) || numel != numel_)
      continue;
    seen_.insert(rec.address);
    if (bw == 0)
      continue; // a client-mode peer is never a leader
    auto& seen = announced_[rec.address];
    seen = std::max(seen, rec.expiration_ns);
    if (auto it = refused_.find(rec.address); it != refused_.end()) {
      if (rec.expiration_ns <= it->second)
        continue;
      refused_.erase(it); // announced anew since it refused
    }
    if (best.empty() || rec.address < best)
      best = rec.address;
  }
  if (!best.empty() && best != current)
    switch_to(best, out);
  else if (opts_.family_groups)
    close_if_back(out);
  if (first_poll && leader_.empty() && !client() && !closed_)
    nudge(records, out);
  return out;
}

void matchmaker::nudge(const std::vector<announcement>& records, std::vector<mm_effect>& out) {
  // The peers our first poll showed were announcing before we started: they may end their window
  // before their next poll shows us, and a peer only asks smaller addresses, so those that would
  // follow us never would (a newcomer with the smallest address, starting late in the others'
  // window, stepped alone at every step: its next request started again just before theirs
  // ended). Our join tells them we lead under the key; they follow us at once (`on_join`).
  for (auto& rec : records) {
    double bw = 0;
    bool aux = false;
    int64_t numel = 0;
    if (rec.address.empty() || rec.address == opts_.address ||
        !decode_announcement(rec.value, bw, aux, numel) || numel != numel_ ||
        (bw > 0 && rec.address < opts_.address) ||
        std::any_of(followers_.begin(), followers_.end(),
                    [&](const messages::member_info& f) { return f.address == rec.address; }))
      continue;
    out.push_back(mm::send_join{rec.address, avg_join{key_, me(), numel_}, epoch_});
  }
}

void matchmaker::refuse(const std::string& leader) {
  auto it = announced_.find(leader);
  refused_[leader] = it == announced_.end() ? 0 : it->second;
}

void matchmaker::switch_to(const std::string& leader, std::vector<mm_effect>& out) {
  if ((!client() && leader >= opts_.address) || refused_.count(leader) > 0 || leader == leader_)
    return;
  if (!leader_.empty())
    out.push_back(mm::send_leave{leader_, avg_leave{key_, opts_.address, std::string{}}});
  for (auto& f : followers_)
    out.push_back(mm::send_leave{f.address, avg_leave{key_, opts_.address, leader}});
  followers_.clear();
  leader_ = leader;
  out.push_back(mm::send_join{leader, avg_join{key_, me(), numel_}, epoch_});
}

std::vector<mm_effect> matchmaker::on_join_reply(uint64_t epoch, const std::string& leader,
                                                 const avg_join_reply& r) {
  std::vector<mm_effect> out;
  if (epoch != epoch_ || phase_ != phase::matching || r.verdict == avg_join_reply::accepted)
    return out;
  if (r.verdict == avg_join_reply::redirected && !r.redirect.empty() && leader_ == leader) {
    leader_.clear();
    if (departed_.count(r.redirect) > 0) {
      // It still follows a leader that told us it left (and handed us to `leader`, whose word
      // of it is still on its way): ask `leader` again at the next poll instead of refusing it.
      return out;
    }
    refuse(leader);
    switch_to(r.redirect, out);
    return out;
  }
  if (r.verdict == avg_join_reply::refused && r.reason == round_over_reason && !closed_ &&
      r.wire_error.empty()) {
    // The smallest leader ran this key's round without us: nobody is left to form it with (we
    // are remembered for the family's next round).
    give_up(fmt::format("{} ({} ran it)", round_over_reason, leader), out);
    return out;
  }
  if (r.verdict == avg_join_reply::refused && r.reason == closed_reason && !closed_ &&
      r.wire_error.empty() && !opts_.family_groups && group_family(key_) != key_ &&
      followers_.empty() && (leader_.empty() || leader_ == leader)) {
    // The group under this key formed without us: we are late for this round. Stepping now
    // keeps our next request in time for the others' next round (see `closed_reason`).
    give_up(fmt::format("late for this round: {} answered '{}'", leader, r.reason), out);
    return out;
  }
  // A reply whose envelope was refused carries only the reason (wire_error).
  return on_join_failed(epoch, leader, r.wire_error.empty() ? r.reason : r.wire_error);
}

std::vector<mm_effect> matchmaker::on_join_failed(uint64_t epoch, const std::string& leader,
                                                  const std::string&) {
  if (epoch != epoch_ || phase_ != phase::matching)
    return {};
  refuse(leader);
  if (leader_ == leader)
    leader_.clear();
  return {};
}

bool matchmaker::previous_group_back() const {
  auto prev = previous_.find(memory_key(key_));
  if (!opts_.persistent_groups || prev == previous_.end() || (opts_.family_groups && !polled_))
    return false;
  auto following = [&](const std::string& a) {
    return std::any_of(followers_.begin(), followers_.end(),
                       [&](const messages::member_info& f) { return f.address == a; });
  };
  for (auto& m : prev->second)
    if (m.address != opts_.address && !following(m.address))
      return false;
  if (!opts_.family_groups)
    return true;
  // A newcomer (or anyone else) announcing under this key is waited for: closing without it
  // would leave it alone for this round.
  return std::all_of(seen_.begin(), seen_.end(),
                     [&](const std::string& a) { return following(a) || departed_.count(a) > 0; });
}

void matchmaker::close_if_back(std::vector<mm_effect>& out) {
  if (phase_ == phase::matching && !closed_ && leader_.empty() && !followers_.empty() &&
      previous_group_back())
    close_group(out);
}

void matchmaker::note_late(const avg_join& j) {
  // A join for the round we lead (closed, running) or led last: remembered with that group, so
  // that the family's next round waits for it too; else a peer that always starts a little
  // later than the others is left out of every round.
  bool may_follow = j.member.bandwidth == 0 || j.member.address > opts_.address;
  if (!opts_.persistent_groups || !opts_.family_groups || !may_follow)
    return;
  auto add = [&](std::vector<messages::member_info>& to) {
    if (to.size() < 2 * opts_.target_group_size &&
        std::none_of(to.begin(), to.end(),
                     [&](const messages::member_info& m) { return m.address == j.member.address; }))
      to.push_back(j.member);
  };
  if (phase_ == phase::formed && j.group_key == key_ && leader_.empty() && !members_.empty() &&
      j.numel == numel_)
    add(late_);
  else if (!last_led_.empty() && j.group_key == last_led_)
    if (auto prev = previous_.find(memory_key(last_led_)); prev != previous_.end())
      add(prev->second);
}

avg_join_reply matchmaker::decide_join(const avg_join& j, std::vector<mm_effect>& out) {
  avg_join_reply r;
  if (phase_ != phase::matching || j.group_key != key_) {
    // The round we led last under that key ran without the joiner: it need not wait for it.
    r.reason = opts_.family_groups && !last_led_.empty() && j.group_key == last_led_
                   ? round_over_reason
                 : j.group_key == formed_key_ ? closed_reason
                                              : "not matchmaking under this key";
    note_late(j);
  } else if (closed_) {
    r.reason = closed_reason;
    note_late(j);
  } else if (client()) {
    r.reason = "a client-mode peer leads no group";
  } else if (!leader_.empty()) {
    r.verdict = avg_join_reply::redirected;
    r.redirect = leader_;
  } else if (j.numel != numel_) {
    r.reason = fmt::format("vector size {} differs from the leader's {}", j.numel, numel_);
  } else if (j.member.bandwidth > 0 && j.member.address <= opts_.address) {
    r.reason = "ask a smaller leader"; // a client joins any leader: it leads none itself
  } else if (!std::isfinite(j.member.bandwidth) || j.member.bandwidth < 0) {
    r.reason = "bad bandwidth";
  } else {
    auto it =
        std::find_if(followers_.begin(), followers_.end(),
                     [&](const messages::member_info& m) { return m.address == j.member.address; });
    if (it == followers_.end() && followers_.size() + 1 >= opts_.target_group_size) {
      r.reason = "group full";
    } else {
      if (it == followers_.end())
        followers_.push_back(j.member);
      else
        *it = j.member;
      r.verdict = avg_join_reply::accepted;
      if (followers_.size() + 1 >= opts_.target_group_size || previous_group_back())
        close_group(out);
    }
  }
  return r;
}

std::vector<mm_effect> matchmaker::on_join(uint64_t ticket, const avg_join& j) {
  std::vector<mm_effect> out;
  bool current = phase_ == phase::matching && j.group_key == key_;
  if (!current && opts_.persistent_groups && waiting_.size() < opts_.target_group_size) {
    // A member of the group we lead in that key's family (the one running now, or the last
    // one) asking before our own next request: it waits (and is refused then if that request
    // is under another key).
    const std::vector<messages::member_info>* group = nullptr;
    if (phase_ == phase::formed && !members_.empty() && memory_key(j.group_key) == memory_key(key_))
      group = &members_;
    else if (memory_key(j.group_key) != memory_key(key_) || phase_ != phase::matching) {
      if (auto prev = previous_.find(memory_key(j.group_key)); prev != previous_.end())
        group = &prev->second;
    }
    if (group != nullptr && leader_of(*group) == opts_.address &&
        std::any_of(group->begin(), group->end(), [&](const messages::member_info& m) {
          return m.address == j.member.address;
        })) {
      for (auto& w : waiting_)
        if (w.join.member.address == j.member.address) {
          avg_join_reply stale;
          stale.reason = "asked again";
          out.push_back(mm::answer_join{w.ticket, std::move(stale)});
          w = waiting_join{ticket, j};
          return out;
        }
      waiting_.push_back(waiting_join{ticket, j});
      return out;
    }
  }
  auto r = decide_join(j, out);
  // A join from a peer that may lead and is smaller than our leader (ourselves when we lead): it
  // leads under our key and found us announcing (`nudge`), maybe after our last poll. We follow
  // it now, as if a poll had shown it (a refusal of it then is over: it leads now). Not after our
  // window, like a poll's records: our leader's group may be on its way.
  auto ours = leader_.empty() && !client() ? opts_.address : leader_;
  if (r.verdict != avg_join_reply::accepted && phase_ == phase::matching && !closed_ &&
      !window_over_ &&
      j.group_key == key_ && j.numel == numel_ && j.member.bandwidth > 0 &&
      std::isfinite(j.member.bandwidth) && !j.member.address.empty() &&
      (ours.empty() || j.member.address < ours)) {
    refused_.erase(j.member.address);
    seen_.insert(j.member.address);
    switch_to(j.member.address, out);
    r = avg_join_reply{};
    r.reason = "following you";
  }
  out.insert(out.begin(), mm::answer_join{ticket, std::move(r)});
  return out;
}

std::vector<mm_effect> matchmaker::on_leave(const avg_leave& l) {
  std::vector<mm_effect> out;
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [&](const waiting_join& w) {
                                  return w.join.member.address == l.address && l.leader.empty();
                                }),
                 waiting_.end());
  if (phase_ != phase::matching || l.group_key != key_ || closed_)
    return out;
  if (!leader_.empty() && l.address == leader_) {
    // Our leader left or moved on: follow the one it names (naming us, or nobody, leaves us
    // leading; a client finds a leader at its next poll).
    refuse(leader_);
    departed_.insert(leader_);
    leader_.clear();
    if (!l.leader.empty())
      switch_to(l.leader, out);
  } else if (l.leader.empty()) {
    followers_.erase(
        std::remove_if(followers_.begin(), followers_.end(),
                       [&](const messages::member_info& m) { return m.address == l.address; }),
        followers_.end());
  }
  return out;
}

void matchmaker::close_group(std::vector<mm_effect>& out) {
  if (closed_ || followers_.empty())
    return;
  closed_ = true;
  phase_ = phase::formed;
  formed_key_ = key_;
  std::vector<messages::member_info> members = followers_;
  members.push_back(me());
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  uint64_t id =
      std::hash<std::string>{}(fmt::format("{}/{}/{}/{}", opts_.address, epoch_, now_ns_, seed_));
  id |= 1; // never 0
  avg_group g{key_, id, members, numel_};
  for (auto& m : followers_)
    out.push_back(mm::send_group{m.address, g});
  members_ = members;
  out.push_back(mm::formed{id, std::move(members)});
}

std::vector<mm_effect> matchmaker::on_group(const avg_group& g) {
  std::vector<mm_effect> out;
  if (phase_ != phase::matching || g.group_key != key_ || closed_ || g.numel != numel_ ||
      g.group_id == 0 || g.members.size() < 2 || g.members.size() > 4096)
    return out;
  if (std::none_of(g.members.begin(), g.members.end(),
                   [&](const messages::member_info& m) { return m.address == opts_.address; }))
    return out;
  closed_ = true;
  phase_ = phase::formed;
  formed_key_ = key_;
  members_ = g.members;
  out.push_back(mm::formed{g.group_id, g.members});
  return out;
}

void matchmaker::give_up(std::string why, std::vector<mm_effect>& out) {
  phase_ = phase::formed; // nothing more happens in this request
  closed_ = true;
  out.push_back(mm::gave_up{std::move(why)});
}

std::vector<mm_effect> matchmaker::on_timer(uint64_t epoch, mm_timer kind) {
  std::vector<mm_effect> out;
  if (epoch != epoch_ || phase_ != phase::matching || closed_)
    return out;
  switch (kind) {
  case mm_timer::poll:
    if (!window_over_) {
      out.push_back(mm::poll{opts_.key_prefix + key_});
      out.push_back(mm::set_timer{epoch_, mm_timer::poll, opts_.poll_interval});
    }
    break;
  case mm_timer::window_end:
    window_over_ = true;
    if (!leader_.empty())
      out.push_back(mm::set_timer{epoch_, mm_timer::follow_deadline, opts_.join_grace});
    else if (!followers_.empty())
      close_group(out);
    else
      give_up("no partner found within the matchmaking window", out);
    break;
  case mm_timer::follow_deadline:
    if (leader_.empty() && !followers_.empty())
      close_group(out); // our leader left after the window and handed its followers to us
    else if (leader_.empty())
      give_up("our leader left and nobody joined us", out);
    else
      give_up(fmt::format("leader {} sent no group", leader_), out);
    break;
  }
  return out;
}

std::vector<mm_effect> matchmaker::finish(std::vector<messages::member_info> members) {
  std::vector<mm_effect> out;
  if (phase_ == phase::matching && !closed_ && !leader_.empty())
    out.push_back(mm::send_leave{leader_, avg_leave{key_, opts_.address, std::string{}}});
  if (phase_ == phase::matching && !closed_ && leader_.empty() && !followers_.empty()) {
    // A leader that stops matching (its peer left) hands its followers to the smallest of them
    // that may lead: without a word they would wait for a group until the window and the grace
    // ended, then each give up, and their peers step alone (apart) on their own gradients.
    std::string next;
    for (auto& f : followers_)
      if (f.bandwidth > 0 && (next.empty() || f.address < next))
        next = f.address;
    for (auto& f : followers_)
      out.push_back(mm::send_leave{f.address, avg_leave{key_, opts_.address, next}});
  }
  if (opts_.persistent_groups && !key_.empty()) {
    for (auto& m : late_)
      if (members.size() >= 2 &&
          std::none_of(members.begin(), members.end(),
                       [&](const messages::member_info& x) { return x.address == m.address; }))
        members.push_back(m);
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.address < b.address; });
    last_led_ = members.size() >= 2 && leader_of(members) == opts_.address ? key_ : "";
    if (members.size() >= 2)
      previous_[memory_key(key_)] = std::move(members);
    else
      previous_.erase(memory_key(key_));
  }
  phase_ = phase::idle;
  key_.clear();
  leader_.clear();
  followers_.clear();
  members_.clear();
  ++epoch_;
  return out;
}

void matchmaker::forget(const std::string& group_key) {
  previous_.erase(memory_key(group_key));
}

} // namespace starling::actors::averager
