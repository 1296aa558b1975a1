#include "actors/averager/averager.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/averager/data_plane.hpp"
#include "actors/dht/client.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/dht.hpp"

namespace starling::actors::averager {

using messages::avg_ack;
using messages::avg_chunk;
using messages::avg_group;
using messages::avg_join;
using messages::avg_join_reply;
using messages::avg_leave;
using messages::average_result;
using messages::tensor_list;
using messages::tensor_msg;

status validate(const averager_options& o) {
  if (o.address.empty())
    return fail("averager: address must be set (host:port/name)");
  if (!std::isfinite(o.bandwidth) || o.bandwidth < 0)
    return fail(fmt::format("averager: bandwidth must be finite and >= 0, got {}", o.bandwidth));
  if (o.target_group_size < 2)
    return fail(fmt::format("averager: target_group_size must be >= 2, got {}",
                            o.target_group_size));
  if (o.matchmaking_window.count() <= 0 || o.poll_interval.count() <= 0
      || o.join_grace.count() < 0 || o.rpc_timeout.count() <= 0 || o.round_timeout.count() <= 0)
    return fail("averager: window, poll interval, rpc and round timeouts must be positive");
  if (!(o.reduce_fraction > 0 && o.reduce_fraction < 1))
    return fail(fmt::format("averager: reduce_fraction must lie in (0, 1), got {}",
                            o.reduce_fraction));
  if (o.window < 1)
    return fail("averager: window must be >= 1");
  if (o.min_part < 1)
    return fail(fmt::format("averager: min_part must be >= 1, got {}", o.min_part));
  return {};
}

namespace {

enum timer_kind : uint8_t { t_poll, t_window_end, t_follow_deadline, t_reduce, t_round_end };

/// Announcement value: "v1 <bandwidth> <auxiliary> <numel>".
std::vector<char> encode_announce(double bw, bool aux, int64_t numel) {
  auto s = fmt::format("v1 {} {} {}", bw, aux ? 1 : 0, numel);
  return {s.begin(), s.end()};
}

bool decode_announce(const std::vector<char>& v, double& bw, bool& aux, int64_t& numel) {
  if (v.size() > 128)
    return false;
  std::istringstream in(std::string(v.begin(), v.end()));
  std::string tag;
  int a = 0;
  if (!(in >> tag >> bw >> a >> numel) || tag != "v1")
    return false;
  aux = a != 0;
  return std::isfinite(bw) && bw >= 0 && numel >= 0 && (a == 0 || a == 1);
}

/// One outgoing chunk not built yet: elements [offset, offset + len) of a part.
struct pending_chunk {
  int64_t offset = 0;
  int64_t len = 0;
};

/// Chunks to one destination of one kind, with the credit window.
struct out_stream {
  std::deque<pending_chunk> queue;
  uint32_t inflight = 0;
};

/// How chunks reach a member: not decided yet (asking for a data-plane token), BASP, data plane.
enum class link_mode : uint8_t { pending, basp, plane };

/// A chunk that arrived before its group message, with how it came.
struct early_chunk {
  avg_chunk chunk;
  /// BASP: the sender to acknowledge.
  caf::strong_actor_ptr sender;
  /// Data plane: the address of the link's peer.
  std::string plane_peer;
};

struct round_state {
  uint64_t id = 0;
  round_plan plan;
  uint32_t self = 0;
  bool aux = false;
  double weight = 1;
  /// Own input (never modified) and the result being assembled.
  at::Tensor flat;
  at::Tensor out;
  std::vector<caf::actor> handles;
  std::vector<bool> gone;
  std::optional<part_reducer> reducer;
  bool reduced = false;
  at::Tensor reduced_part;
  /// Who reached which segment of our part (one segment when everybody reached all of it).
  std::vector<messages::part_segment> reduced_segments;
  std::string reduce_error;
  /// Result chunks received per part: (offset, size, contributors), for the report.
  std::vector<std::vector<messages::part_segment>> result_pieces;
  std::vector<messages::part_report> parts;
  std::vector<bool> resolved;
  /// Result elements received per part.
  std::vector<range_set> result_ranges;
  /// Key: (member, kind).
  std::map<std::pair<uint32_t, uint8_t>, out_stream> streams;
  std::vector<link_mode> links;
  /// Our reduced part cut into plane chunks, built once and shared by every member's link.
  std::map<int64_t, std::shared_ptr<plane_chunk>> result_chunks;
  uint64_t contribution_chunks_total = 0;
  uint64_t contribution_chunks_sent = 0;
  bool replied = false;
  caf::actor_clock::time_point started;
};

struct job {
  std::string group_key;
  std::vector<tensor_msg> inputs;
  double weight = 1;
  caf::response_promise rp;
  at::Tensor flat;
  caf::actor_clock::time_point started;
};

enum class phase { idle, matching, round };

class averager_impl : public std::enable_shared_from_this<averager_impl> {
public:
  averager_impl(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                averager_options opts)
    : self_(self), dht_(std::move(dht)), resolver_(std::move(resolver)), opts_(std::move(opts)) {
    // An empty reducer is the weighted mean, which part_reducer streams without copies.
    // A client-mode averager (bandwidth 0) listens on nothing: no data plane.
    if (!opts_.data_host.empty() && !client()) {
      data_plane_options po;
      po.host = opts_.data_host;
      po.io_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(opts_.data_io_timeout);
      // Each incoming link holds at most `link_buffers` (2) delivered chunks at once (plus one
      // being read): the weighted mean adds a chunk and drops it, so a round needs about three
      // buffers per link, which the pool keeps for the next round (fresh pages are expensive).
      po.pool_buffers = 32;
      auto p = data_plane::open(caf::actor_cast<caf::actor>(self_), po);
      if (p)
        plane_ = std::move(*p);
      else
        plane_error_ = p.error().what; // BASP only; said in every round's report
    }
  }

  caf::behavior make_behavior();

private:
  // -- jobs ----------------------------------------------------------------------------------
  void enqueue(job j);
  void start_next();
  void finish_job(average_result res);
  void fail_job(const std::string& why, messages::round_outcome outcome);
  average_result unchanged_result(messages::round_outcome outcome, const std::string& why);
  std::string dht_key() const { return opts_.key_prefix + cur_->group_key; }
  void cancel();

  // -- matchmaking -----------------------------------------------------------------------------
  void start_matching();
  void poll();
  void on_records(const messages::dht_get_result& r);
  void switch_to(const std::string& leader);
  avg_join_reply on_join(const avg_join& j, const caf::actor& sender);
  void on_leave(const avg_leave& l);
  void on_group(const avg_group& g);
  void close_group();
  void timer(uint64_t epoch, uint8_t kind);
  messages::member_info me() const {
    return {opts_.address, opts_.bandwidth, opts_.auxiliary};
  }
  /// Client mode (bandwidth 0): leads no group, reduces nothing, is never connected to.
  bool client() const { return opts_.bandwidth == 0; }
  /// Whether member `i` of the round is in client mode.
  bool client_member(uint32_t i) const { return round_->plan.members[i].bandwidth == 0; }
  void with_peer(const std::string& address, std::function<void(caf::actor)> ok,
                 std::function<void()> err);

  // -- round -----------------------------------------------------------------------------------
  void start_round(uint64_t id, std::vector<messages::member_info> members);
  void on_chunk(avg_chunk& c, const caf::strong_actor_ptr& sender);
  void on_plane_chunk(avg_chunk& c, const std::string& peer);
  void accept_chunk(avg_chunk& c);
  void open_link(uint32_t member, const caf::actor& handle);
  void on_link_lost(const std::string& peer, const std::string& why);
  void pump_plane(uint32_t member, uint8_t kind);
  /// Counts a contribution chunk handed to a path; false when the `fail_sending` fault quit.
  bool contribution_sent();
  void on_ack(const avg_ack& a);
  void pump(uint32_t member, uint8_t kind);
  void member_gone(uint32_t i, const std::string& why);
  void maybe_reduce(bool deadline);
  /// The members averaged into our reduced part at element `offset` of it.
  std::vector<uint32_t> contributors_at(int64_t offset) const;
  void resolve_part(uint32_t part, messages::part_status st, std::string reason,
                    std::vector<uint32_t> contributors = {});
  void check_done();
  void reply_round();
  void end_round();
  void apply_fault_at_start();

  caf::event_based_actor* self_;
  caf::actor dht_;
  caf::actor resolver_;
  averager_options opts_;
  std::map<std::string, caf::actor> peers_;
  /// Addresses seen in client mode: never resolved (nobody connects to a client); reached only
  /// through a handle it gave us by messaging us (a join, a chunk).
  std::set<std::string> clients_;
  std::shared_ptr<data_plane> plane_;
  std::string plane_error_;
  /// Result and reduced-part buffers of earlier rounds, reused once nobody else holds them:
  /// fresh pages cost more than the copies themselves (a 16 MiB copy into new memory took
  /// 100-200 ms on this VM, page faults included).
  std::vector<at::Tensor> out_cache_;
  std::vector<at::Tensor> reduced_cache_;
  /// Lost or refused data-plane links per peer; from `max_link_failures` on, BASP only.
  std::map<std::string, int> link_failures_;
  static constexpr int max_link_failures = 3;

  std::deque<job> queue_;
  std::optional<job> cur_;
  phase phase_ = phase::idle;
  uint64_t epoch_ = 0;

  // matchmaking
  std::string leader_;
  std::vector<messages::member_info> followers_;
  /// Leaders that refused us, with the expiration of their announcement when they did: a
  /// refusal holds until the leader announces itself anew (it starts matchmaking again).
  std::map<std::string, int64_t> refused_;
  /// The latest announcement expiration seen per address in this matchmaking.
  std::map<std::string, int64_t> announced_;
  void refuse(const std::string& leader) {
    auto it = announced_.find(leader);
    refused_[leader] = it == announced_.end() ? 0 : it->second;
  }
  bool closed_ = false;
  bool window_over_ = false;
  std::vector<early_chunk> early_;

  // round
  std::optional<round_state> round_;
};

// -- helpers -------------------------------------------------------------------------------------

/// A fp32 buffer of `n` elements from `cache` that nobody else references, or a new one.
at::Tensor take_buffer(std::vector<at::Tensor>& cache, int64_t n) {
  for (auto it = cache.begin(); it != cache.end(); ++it)
    if (it->numel() == n && it->use_count() == 1 && it->storage().use_count() == 1) {
      auto t = std::move(*it);
      cache.erase(it);
      return t;
    }
  return torch::empty({n}, torch::kFloat32);
}

/// A part's received result chunks as segments: in order, adjacent chunks with the same
/// contributors merged.
std::vector<messages::part_segment> merge_pieces(std::vector<messages::part_segment> pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<messages::part_segment> out;
  for (auto& p : pieces) {
    std::sort(p.contributors.begin(), p.contributors.end());
    p.contributors.erase(std::unique(p.contributors.begin(), p.contributors.end()),
                         p.contributors.end());
    append_segment(out, std::move(p));
  }
  return out;
}

/// Keeps `t` for reuse (at most two per cache: a caller may still hold the previous result).
void keep_buffer(std::vector<at::Tensor>& cache, at::Tensor t) {
  if (!t.defined() || t.numel() == 0)
    return;
  cache.push_back(std::move(t));
  if (cache.size() > 2)
    cache.erase(cache.begin());
}

void averager_impl::with_peer(const std::string& address, std::function<void(caf::actor)> ok,
                              std::function<void()> err) {
  if (auto it = peers_.find(address); it != peers_.end()) {
    ok(it->second);
    return;
  }
  if (clients_.count(address) > 0) {
    err(); // a client-mode peer accepts no connection
    return;
  }
  auto weak = weak_from_this();
  self_->request(resolver_, opts_.rpc_timeout, resolve_atom::value, address)
      .then(
          [weak, address, ok, err](const caf::actor& a) {
            auto me = weak.lock();
            if (!me)
              return;
            if (!a) {
              err();
              return;
            }
            me->peers_[address] = a;
            ok(a);
          },
          [weak, err](caf::error&) {
            if (weak.lock())
              err();
          });
}

// -- jobs ----------------------------------------------------------------------------------------

void averager_impl::enqueue(job j) {
  queue_.push_back(std::move(j));
  if (phase_ == phase::idle && !cur_)
    start_next();
}

average_result averager_impl::unchanged_result(messages::round_outcome outcome,
                                               const std::string& why) {
  average_result res;
  res.tensors = cur_->inputs;
  res.report.group_key = cur_->group_key;
  res.report.members = {me()};
  res.report.outcome = outcome;
  res.report.detail = why;
  return res;
}

void averager_impl::finish_job(average_result res) {
  if (!cur_)
    return;
  res.report.elapsed_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(self_->clock().now() - cur_->started)
          .count();
  cur_->rp.deliver(std::move(res));
}

void averager_impl::fail_job(const std::string& why, messages::round_outcome outcome) {
  finish_job(unchanged_result(outcome, why));
  cur_.reset();
  phase_ = phase::idle;
  early_.clear();
  start_next();
}

void averager_impl::start_next() {
  while (!cur_ && !queue_.empty()) {
    cur_ = std::move(queue_.front());
    queue_.pop_front();
    cur_->started = self_->clock().now();
    // Validate and flatten the input.
    std::string why;
    if (cur_->group_key.empty() || cur_->group_key.size() > 256)
      why = "group key must have 1..256 characters";
    else if (!std::isfinite(cur_->weight) || cur_->weight < 0)
      why = fmt::format("weight must be finite and >= 0, got {}", cur_->weight);
    std::vector<at::Tensor> parts;
    for (size_t i = 0; why.empty() && i < cur_->inputs.size(); ++i) {
      auto& t = cur_->inputs[i];
      if (!t.ok())
        why = fmt::format("tensor {} arrived broken: {}", i, t.error);
      else if (!t.tensor.defined())
        why = fmt::format("tensor {} is undefined", i);
      else if (!t.tensor.is_floating_point())
        why = fmt::format("tensor {} must be floating point", i);
      else
        parts.push_back(t.tensor.detach().to(torch::kCPU, torch::kFloat32).reshape({-1}));
    }
    if (why.empty()) {
      try {
        // One contiguous fp32 tensor is used as it is (no copy: the caller keeps it unchanged
        // until the reply, see averager.hpp); several are concatenated.
        if (parts.empty())
          cur_->flat = torch::empty({0}, torch::kFloat32);
        else if (parts.size() == 1 && parts[0].is_contiguous())
          cur_->flat = parts[0];
        else
          cur_->flat = torch::cat(parts).contiguous();
        if (!all_finite(cur_->flat))
          why = "the tensors hold non-finite values";
      } catch (const std::exception& e) {
        why = fmt::format("flattening failed: {}", e.what());
      }
    }
    if (!why.empty()) {
      finish_job(unchanged_result(messages::round_outcome::error, why));
      cur_.reset();
      continue;
    }
    start_matching();
  }
}

void averager_impl::cancel() {
  if (!cur_)
    return;
  cur_->rp.deliver(caf::make_error(caf::sec::request_timeout, "averaging cancelled"));
  if (phase_ == phase::round && round_) {
    avg_leave l{cur_->group_key, opts_.address, std::string{}};
    for (uint32_t i = 0; i < round_->plan.num_members(); ++i)
      if (i != round_->self)
        with_peer(round_->plan.members[i].address, [this, l](caf::actor a) { self_->send(a, l); },
                  [] {});
    round_.reset();
  } else if (phase_ == phase::matching) {
    if (!leader_.empty())
      with_peer(leader_, [this](caf::actor a) {
        self_->send(a, avg_leave{cur_ ? cur_->group_key : "", opts_.address, ""});
      }, [] {});
  }
  ++epoch_;
  cur_.reset();
  phase_ = phase::idle;
  early_.clear();
  start_next();
}

// -- matchmaking ---------------------------------------------------------------------------------

void averager_impl::start_matching() {
  ++epoch_;
  phase_ = phase::matching;
  leader_.clear();
  followers_.clear();
  refused_.clear();
  announced_.clear();
  closed_ = false;
  window_over_ = false;
  early_.clear();
  auto put = dht::make_subkey_put(
      dht_key(), opts_.address,
      encode_announce(opts_.bandwidth, opts_.auxiliary, cur_->flat.numel()),
      dht::expires_in(self_, 2 * opts_.matchmaking_window + opts_.join_grace));
  dht::dht_store(
      self_, dht_, std::move(put), opts_.rpc_timeout, [](const messages::dht_put_result&) {},
      [](caf::error&) {});
  auto e = epoch_;
  self_->delayed_send(self_, opts_.poll_interval, avg_timer_atom::value, e, uint8_t{t_poll});
  self_->delayed_send(self_, opts_.matchmaking_window, avg_timer_atom::value, e,
                      uint8_t{t_window_end});
}

void averager_impl::poll() {
  auto e = epoch_;
  auto weak = weak_from_this();
  dht::dht_get(
      self_, dht_, dht_key(), opts_.rpc_timeout,
      [weak, e](const messages::dht_get_result& r) {
        auto me = weak.lock();
        if (me && me->epoch_ == e && me->phase_ == phase::matching)
          me->on_records(r);
      },
      [](caf::error&) {});
  self_->delayed_send(self_, opts_.poll_interval, avg_timer_atom::value, e, uint8_t{t_poll});
}

void averager_impl::on_records(const messages::dht_get_result& r) {
  if (closed_ || window_over_)
    return;
  // A refusal holds until the refusing peer announces itself again: a leader still busy with its
  // previous round re-announces when it starts matching (then it is asked again), a full or closed
  // one does not. (Refusals that held for one poll only made all 7 other peers of an 8-peer bench
  // ask a smallest leader stuck in its previous round every poll until the window ended, and
  // nobody averaged.)
  // A client never leads: it follows the smallest non-client address, whatever its own.
  auto current = leader_.empty() && !client() ? opts_.address : leader_;
  std::string best = current;
  for (auto& rec : r.records) {
    if (!rec.has_subkey || rec.subkey.empty() || rec.subkey == opts_.address)
      continue;
    double bw = 0;
    bool aux = false;
    int64_t numel = 0;
    if (!decode_announce(rec.value, bw, aux, numel) || numel != cur_->flat.numel())
      continue;
    if (bw == 0) {
      clients_.insert(rec.subkey);
      continue; // a client-mode peer is never a leader
    }
    auto& seen = announced_[rec.subkey];
    seen = std::max(seen, rec.expiration_ns);
    if (auto it = refused_.find(rec.subkey); it != refused_.end()) {
      if (rec.expiration_ns <= it->second)
        continue;
      refused_.erase(it); // announced anew since it refused
    }
    if (best.empty() || rec.subkey < best)
      best = rec.subkey;
  }
  if (!best.empty() && best != current)
    switch_to(best);
}

void averager_impl::switch_to(const std::string& leader) {
  if ((!client() && leader >= opts_.address) || refused_.count(leader) > 0)
    return;
  auto key = cur_->group_key;
  if (!leader_.empty() && leader_ != leader) {
    auto old = leader_;
    with_peer(old, [this, key](caf::actor a) {
      self_->send(a, avg_leave{key, opts_.address, std::string{}});
    }, [] {});
  }
  for (auto& f : followers_)
    with_peer(f.address, [this, key, leader](caf::actor a) {
      self_->send(a, avg_leave{key, opts_.address, leader});
    }, [] {});
  followers_.clear();
  leader_ = leader;
  auto e = epoch_;
  auto weak = weak_from_this();
  auto on_refused = [weak, e, leader](const std::string&) {
    auto me = weak.lock();
    if (!me || me->epoch_ != e || me->phase_ != phase::matching)
      return;
    me->refuse(leader);
    if (me->leader_ == leader)
      me->leader_.clear();
  };
  avg_join j{key, me(), cur_->flat.numel()};
  with_peer(
      leader,
      [this, weak, e, j, leader, on_refused](caf::actor a) {
        self_->request(a, opts_.rpc_timeout, j)
            .then(
                [weak, e, leader, on_refused](const avg_join_reply& r) {
                  auto me = weak.lock();
                  if (!me || me->epoch_ != e || me->phase_ != phase::matching)
                    return;
                  if (r.verdict == avg_join_reply::accepted)
                    return;
                  if (r.verdict == avg_join_reply::redirected && !r.redirect.empty()
                      && me->leader_ == leader) {
                    me->refuse(leader);
                    me->leader_.clear();
                    me->switch_to(r.redirect);
                    return;
                  }
                  on_refused(r.reason);
                },
                [on_refused](caf::error& err) { on_refused(caf::to_string(err)); });
      },
      [on_refused] { on_refused("unresolvable"); });
}

avg_join_reply averager_impl::on_join(const avg_join& j, const caf::actor& sender) {
  avg_join_reply r;
  if (phase_ != phase::matching || !cur_ || j.group_key != cur_->group_key) {
    r.reason = "not matchmaking under this key";
  } else if (closed_) {
    r.reason = "group already closed";
  } else if (client()) {
    r.reason = "a client-mode peer leads no group";
  } else if (!leader_.empty()) {
    r.verdict = avg_join_reply::redirected;
    r.redirect = leader_;
  } else if (j.numel != cur_->flat.numel()) {
    r.reason = fmt::format("vector size {} differs from the leader's {}", j.numel,
                           cur_->flat.numel());
  } else if (j.member.bandwidth > 0 && j.member.address <= opts_.address) {
    r.reason = "ask a smaller leader"; // clients join any leader
  } else if (!std::isfinite(j.member.bandwidth) || j.member.bandwidth < 0) {
    r.reason = "bad bandwidth";
  } else {
    auto it = std::find_if(followers_.begin(), followers_.end(),
                           [&](const messages::member_info& m) {
                             return m.address == j.member.address;
                           });
    if (it == followers_.end() && followers_.size() + 1 >= opts_.target_group_size) {
      r.reason = "group full";
    } else {
      if (it == followers_.end())
        followers_.push_back(j.member);
      else
        *it = j.member;
      r.verdict = avg_join_reply::accepted;
    }
  }
  // The joiner's handle as we see it: the group message then leaves synchronously when the
  // group closes (a leader that fails right after still informs everyone).
  if (r.verdict == avg_join_reply::accepted && sender)
    peers_.emplace(j.member.address, sender);
  if (r.verdict == avg_join_reply::accepted && j.member.bandwidth == 0)
    clients_.insert(j.member.address);
  if (r.verdict == avg_join_reply::accepted && followers_.size() + 1 >= opts_.target_group_size)
    close_group();
  return r;
}

void averager_impl::on_leave(const avg_leave& l) {
  if (!cur_ || l.group_key != cur_->group_key)
    return;
  if (phase_ == phase::round && round_) {
    for (uint32_t i = 0; i < round_->plan.num_members(); ++i)
      if (round_->plan.members[i].address == l.address && i != round_->self)
        member_gone(i, "left the round");
    return;
  }
  if (phase_ != phase::matching || closed_)
    return;
  if (l.leader.empty()) {
    followers_.erase(std::remove_if(followers_.begin(), followers_.end(),
                                    [&](const messages::member_info& m) {
                                      return m.address == l.address;
                                    }),
                     followers_.end());
  } else if (l.address == leader_) {
    refuse(leader_);
    leader_.clear();
    switch_to(l.leader);
  }
}

void averager_impl::close_group() {
  if (closed_ || followers_.empty())
    return;
  closed_ = true;
  std::vector<messages::member_info> members = followers_;
  members.push_back(me());
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  auto now = self_->clock().now().time_since_epoch().count();
  uint64_t id = std::hash<std::string>{}(fmt::format("{}/{}/{}", opts_.address, epoch_, now));
  id |= 1; // never 0
  avg_group g{cur_->group_key, id, members, cur_->flat.numel()};
  for (auto& m : followers_)
    with_peer(m.address, [this, g](caf::actor a) { self_->send(a, g); }, [] {});
  start_round(id, members);
}

void averager_impl::on_group(const avg_group& g) {
  if (phase_ != phase::matching || !cur_ || g.group_key != cur_->group_key || closed_
      || g.numel != cur_->flat.numel() || g.group_id == 0 || g.members.size() < 2
      || g.members.size() > 4096)
    return;
  bool found = false;
  for (auto& m : g.members)
    found = found || m.address == opts_.address;
  if (!found)
    return;
  closed_ = true;
  start_round(g.group_id, g.members);
}

void averager_impl::timer(uint64_t epoch, uint8_t kind) {
  if (epoch != epoch_ || !cur_)
    return;
  switch (kind) {
    case t_poll:
      if (phase_ == phase::matching && !closed_ && !window_over_)
        poll();
      break;
    case t_window_end:
      if (phase_ != phase::matching || closed_)
        break;
      window_over_ = true;
      if (leader_.empty()) {
        if (!followers_.empty())
          close_group();
        else
          fail_job("no partner found within the matchmaking window",
                   messages::round_outcome::no_partner);
      } else {
        self_->delayed_send(self_, opts_.join_grace, avg_timer_atom::value, epoch,
                            uint8_t{t_follow_deadline});
      }
      break;
    case t_follow_deadline:
      if (phase_ == phase::matching && !closed_)
        fail_job(fmt::format("leader {} sent no group", leader_),
                 messages::round_outcome::no_partner);
      break;
    case t_reduce:
      if (phase_ == phase::round && round_)
        maybe_reduce(true);
      break;
    case t_round_end:
      if (phase_ == phase::round && round_) {
        for (uint32_t p = 0; p < round_->plan.num_members(); ++p)
          if (!round_->resolved[p])
            resolve_part(p, messages::part_status::own_value_kept, "round deadline passed");
        reply_round();
        end_round();
      }
      break;
  }
}

// -- round ---------------------------------------------------------------------------------------

void averager_impl::start_round(uint64_t id, std::vector<messages::member_info> members) {
  phase_ = phase::round;
  ++epoch_; // matchmaking timers are stale from here on
  auto plan = make_plan(members, cur_->flat.numel(), opts_.min_part);
  if (!plan) {
    fail_job("cannot plan the round: " + plan.error().what, messages::round_outcome::error);
    return;
  }
  round_.emplace();
  auto& r = *round_;
  r.id = id;
  r.started = self_->clock().now();
  r.plan = std::move(*plan);
  auto n = static_cast<uint32_t>(r.plan.num_members());
  for (uint32_t i = 0; i < n; ++i)
    if (r.plan.members[i].address == opts_.address)
      r.self = i;
  r.aux = r.plan.members[r.self].auxiliary;
  r.weight = r.aux ? 0.0 : cur_->weight;
  r.flat = cur_->flat;
  // Every part of the result is written before the reply (averaged values or our own ones).
  r.out = take_buffer(out_cache_, r.flat.numel());
  r.handles.resize(n);
  r.links.assign(n, link_mode::pending);
  r.gone.assign(n, false);
  r.resolved.assign(n, false);
  r.result_ranges.assign(n, {});
  r.result_pieces.assign(n, {});
  r.parts.resize(n);
  for (uint32_t p = 0; p < n; ++p) {
    auto& pr = r.parts[p];
    pr.reducer = p;
    pr.offset = r.plan.offsets[p];
    pr.size = r.plan.sizes[p];
    if (pr.size == 0) {
      r.resolved[p] = true;
      pr.status = messages::part_status::averaged;
      pr.reason = "empty part";
    } else if (r.aux) {
      r.resolved[p] = true;
      pr.status = messages::part_status::own_value_kept;
      pr.reason = "auxiliary member keeps its own values";
    }
  }
  // Our own reducer.
  if (r.plan.sizes[r.self] > 0)
    r.reducer.emplace(r.plan.sizes[r.self], r.plan.senders(), opts_.reducer,
                      take_buffer(reduced_cache_, r.plan.sizes[r.self]));
  else
    r.reduced = true;
  auto e = epoch_;
  self_->delayed_send(self_,
                      std::chrono::duration_cast<caf::timespan>(opts_.round_timeout
                                                                * opts_.reduce_fraction),
                      avg_timer_atom::value, e, uint8_t{t_reduce});
  self_->delayed_send(self_, opts_.round_timeout, avg_timer_atom::value, e, uint8_t{t_round_end});

  if (opts_.fault == injected_fault::fail_before) {
    self_->quit(caf::exit_reason::user_shutdown);
    return;
  }
  if (opts_.fault == injected_fault::cancel) {
    cancel();
    return;
  }

  // Queue our contributions (chunk descriptors; tensors are sliced when sent).
  auto chunk_elems = opts_.chunk_bytes == 0
                         ? std::numeric_limits<int64_t>::max()
                         : std::max<int64_t>(1, static_cast<int64_t>(opts_.chunk_bytes / 4));
  if (!r.aux) {
    for (uint32_t p = 0; p < n; ++p) {
      auto size = r.plan.sizes[p];
      if (size == 0)
        continue;
      if (p == r.self) {
        auto st = r.reducer->add(r.self, r.weight, 0, r.flat.narrow(0, r.plan.offsets[p], size));
        (void) st;
        continue;
      }
      auto& s = r.streams[{p, avg_chunk::contribution}];
      for (int64_t off = 0; off < size; off += chunk_elems) {
        s.queue.push_back({off, std::min(chunk_elems, size - off)});
        ++r.contribution_chunks_total;
      }
    }
  }
  // Resolve and monitor every other member, then start sending to it.
  auto weak = weak_from_this();
  auto rid = r.id;
  for (uint32_t i = 0; i < n; ++i) {
    if (i == r.self)
      continue;
    if (client_member(i)) {
      clients_.insert(r.plan.members[i].address);
      // Nobody connects to a client: we reach it over the handle it gave us when it joined (the
      // leader) or with its first chunk (on_chunk), i.e. over the link it opened.
      if (auto it = peers_.find(r.plan.members[i].address); it != peers_.end()) {
        r.handles[i] = it->second;
        self_->monitor(it->second);
        r.links[i] = link_mode::basp;
      }
      continue;
    }
    with_peer(
        r.plan.members[i].address,
        [this, weak, rid, i](caf::actor a) {
          if (!round_ || round_->id != rid || round_->gone[i])
            return;
          round_->handles[i] = a;
          self_->monitor(a);
          open_link(i, a);
        },
        [this, weak, rid, i] {
          if (round_ && round_->id == rid)
            member_gone(i, "could not be resolved");
        });
  }
  // Chunks that arrived before the group message.
  auto early = std::move(early_);
  early_.clear();
  for (auto& e : early) {
    if (!round_ || e.chunk.group_id != rid)
      continue;
    if (e.plane_peer.empty())
      on_chunk(e.chunk, e.sender);
    else
      on_plane_chunk(e.chunk, e.plane_peer);
  }
  maybe_reduce(false);
  check_done();
}

void averager_impl::pump(uint32_t member, uint8_t kind) {
  if (!round_)
    return;
  auto& r = *round_;
  if (r.gone[member] || !r.handles[member])
    return;
  auto delayed = (kind == avg_chunk::contribution && opts_.fault == injected_fault::slow_sending)
                 || (kind == avg_chunk::result && opts_.fault == injected_fault::slow_reducing);
  if (r.links[member] == link_mode::pending)
    return; // asking for a data-plane token
  if (r.links[member] == link_mode::plane && !delayed) {
    pump_plane(member, kind);
    return;
  }
  auto it = r.streams.find({member, kind});
  if (it == r.streams.end())
    return;
  auto& s = it->second;
  while (s.inflight < opts_.window && !s.queue.empty() && round_) {
    auto pc = s.queue.front();
    s.queue.pop_front();
    avg_chunk c;
    c.group_id = r.id;
    c.kind = kind;
    c.from = r.self;
    c.offset = pc.offset;
    at::Tensor slice;
    if (kind == avg_chunk::contribution) {
      c.part = member;
      c.weight = r.weight;
      slice = r.flat.narrow(0, r.plan.offsets[member] + pc.offset, pc.len);
    } else {
      c.part = r.self;
      c.contributors = contributors_at(pc.offset);
      if (!r.reduce_error.empty())
        c.error = r.reduce_error;
      else
        slice = r.reduced_part.narrow(0, pc.offset, pc.len);
    }
    if (slice.defined()) {
      tensor_msg tm{slice, opts_.codec, opts_.codec_params, {}};
      if (opts_.codec == kernels::codec_id::none) {
        c.values = std::move(tm);
      } else if (auto st = messages::save_tensor(tm, c.encoded); !st) {
        // A codec that cannot encode this chunk (e.g. out of range): send it uncompressed.
        c.encoded.clear();
        c.values = tensor_msg{slice, kernels::codec_id::none, {}, {}};
      }
    }
    ++s.inflight;
    if (delayed)
      self_->delayed_send(r.handles[member], opts_.fault_delay, std::move(c));
    else
      self_->send(r.handles[member], std::move(c));
    if (kind == avg_chunk::contribution && !contribution_sent())
      return;
  }
}

void averager_impl::on_ack(const avg_ack& a) {
  if (!round_ || a.group_id != round_->id || a.from >= round_->plan.num_members())
    return;
  auto it = round_->streams.find({a.from, a.kind});
  if (it == round_->streams.end() || it->second.inflight == 0)
    return;
  --it->second.inflight;
  pump(a.from, a.kind);
  check_done();
}

void averager_impl::on_chunk(avg_chunk& c, const caf::strong_actor_ptr& sender) {
  if (!round_ || c.group_id != round_->id) {
    if (phase_ == phase::matching && early_.size() < 4096)
      early_.push_back(early_chunk{std::move(c), sender, {}});
    return;
  }
  auto& r = *round_;
  auto n = r.plan.num_members();
  if (c.from >= n || c.from == r.self || r.gone[c.from])
    return;
  if (client_member(c.from) && !r.handles[c.from] && sender) {
    // A client's first chunk: answer it over the link it opened.
    auto h = caf::actor_cast<caf::actor>(sender);
    r.handles[c.from] = h;
    peers_[r.plan.members[c.from].address] = h;
    self_->monitor(h);
    r.links[c.from] = link_mode::basp;
    pump(c.from, avg_chunk::result);
    if (!round_)
      return;
  }
  // Ack first: the credit goes back whatever we make of the chunk.
  // (To the message's sender: our handle to that member may not be resolved yet.)
  if (auto to = caf::actor_cast<caf::actor>(sender))
    self_->send(to, avg_ack{r.id, c.kind, c.part, r.self});
  // In-process the values are a view of the sender's own tensor, which its caller may change
  // once the sender's round is over: a reducer that keeps chunks until it reduces (not the
  // streamed weighted mean, which reads them at once) needs a copy.
  if (opts_.reducer && c.kind == avg_chunk::contribution && sender
      && sender->node() == self_->node() && c.values.tensor.defined())
    c.values.tensor = c.values.tensor.clone();
  accept_chunk(c);
}

void averager_impl::on_plane_chunk(avg_chunk& c, const std::string& peer) {
  // A plane chunk's tensor holds one of its link's few receive slots until it is freed: one
  // kept past this handler (before the group message; by a reducer that keeps chunks) is
  // copied so that the link reads on.
  auto release_link = [&c] {
    if (c.values.tensor.defined())
      c.values.tensor = c.values.tensor.clone();
  };
  if (!round_ || c.group_id != round_->id) {
    if (phase_ == phase::matching && early_.size() < 4096) {
      release_link();
      early_.push_back(early_chunk{std::move(c), nullptr, peer});
    }
    return;
  }
  if (opts_.reducer && c.kind == avg_chunk::contribution)
    release_link();
  auto& r = *round_;
  auto n = r.plan.num_members();
  // The link is bound to the address that asked for its token: a chunk must come from there.
  if (c.from >= n || c.from == r.self || r.gone[c.from] || r.plan.members[c.from].address != peer)
    return;
  accept_chunk(c);
}

void averager_impl::open_link(uint32_t i, const caf::actor& handle) {
  auto& r = *round_;
  auto addr = r.plan.members[i].address;
  auto decide = [this](uint32_t member, link_mode m) {
    round_->links[member] = m;
    pump(member, avg_chunk::contribution);
    if (round_)
      pump(member, avg_chunk::result);
  };
  if (!plane_ || client_member(i) || link_failures_[addr] >= max_link_failures) {
    decide(i, link_mode::basp);
    return;
  }
  if (plane_->linked(addr)) {
    decide(i, link_mode::plane);
    return;
  }
  auto rid = r.id;
  auto still = [this, rid, i] { return round_ && round_->id == rid && !round_->gone[i]; };
  self_->request(handle, opts_.rpc_timeout, avg_plane_atom::value, opts_.address)
      .then(
          [this, addr, still, decide, i](std::string& host, uint16_t port, std::string& token) {
            bool ok = false;
            if (port == 0 || host.empty()) {
              link_failures_[addr] = max_link_failures; // the peer has no data plane
            } else if (auto st = plane_->connect(addr, host, port, token); st) {
              ok = true;
            } else {
              ++link_failures_[addr];
            }
            if (still())
              decide(i, ok ? link_mode::plane : link_mode::basp);
          },
          [this, addr, still, decide, i](caf::error&) {
            ++link_failures_[addr];
            if (still())
              decide(i, link_mode::basp);
          });
}

void averager_impl::on_link_lost(const std::string& peer, const std::string& why) {
  ++link_failures_[peer];
  if (!round_)
    return;
  // What was queued on the link is lost (the round's rules cover it); later chunks take BASP.
  auto& r = *round_;
  for (uint32_t i = 0; i < r.plan.num_members(); ++i)
    if (r.plan.members[i].address == peer && r.links[i] == link_mode::plane) {
      r.links[i] = link_mode::basp;
      r.parts[i].reason = "data plane: " + why;
    }
}

bool averager_impl::contribution_sent() {
  auto& r = *round_;
  ++r.contribution_chunks_sent;
  if (opts_.fault == injected_fault::fail_sending
      && r.contribution_chunks_sent * 2 >= r.contribution_chunks_total) {
    self_->quit(caf::exit_reason::user_shutdown);
    round_.reset();
    return false;
  }
  return true;
}

void averager_impl::pump_plane(uint32_t member, uint8_t kind) {
  auto& r = *round_;
  auto it = r.streams.find({member, kind});
  if (it == r.streams.end())
    return;
  auto& s = it->second;
  const auto& addr = r.plan.members[member].address;
  while (!s.queue.empty() && round_) {
    auto pc = s.queue.front();
    std::shared_ptr<plane_chunk> c;
    if (kind == avg_chunk::contribution) {
      plane_meta m;
      m.group_id = r.id;
      m.kind = kind;
      m.part = member;
      m.from = r.self;
      m.weight = r.weight;
      m.offset = pc.offset;
      c = std::make_shared<plane_chunk>(
          std::move(m), r.flat.narrow(0, r.plan.offsets[member] + pc.offset, pc.len), opts_.codec,
          opts_.codec_params);
    } else {
      auto& shared = r.result_chunks[pc.offset];
      if (!shared) {
        plane_meta m;
        m.group_id = r.id;
        m.kind = kind;
        m.part = r.self;
        m.from = r.self;
        m.offset = pc.offset;
        m.contributors = contributors_at(pc.offset);
        m.error = r.reduce_error;
        shared = std::make_shared<plane_chunk>(
            std::move(m),
            r.reduce_error.empty() ? r.reduced_part.narrow(0, pc.offset, pc.len) : at::Tensor{},
            opts_.codec, opts_.codec_params);
      }
      c = shared;
    }
    if (!plane_->send(addr, std::move(c))) {
      // The link died since this round chose it: the rest goes over BASP.
      r.links[member] = link_mode::basp;
      pump(member, kind);
      return;
    }
    s.queue.pop_front();
    if (kind == avg_chunk::contribution && !contribution_sent())
      return;
  }
}

void averager_impl::accept_chunk(avg_chunk& c) {
  auto& r = *round_;
  at::Tensor values;
  if (c.error.empty()) {
    if (!c.encoded.empty()) {
      tensor_msg tm;
      if (auto st = messages::load_tensor(c.encoded, tm); st)
        values = tm.tensor;
    } else if (c.values.ok() && c.values.tensor.defined()) {
      values = c.values.tensor;
    }
    if (values.defined())
      values = values.reshape({-1});
  }
  if (c.kind == avg_chunk::contribution) {
    if (c.part != r.self || !r.reducer || r.reduced)
      return;
    if (values.defined() && r.reducer->has(c.from, c.offset, values.numel()))
      return; // a duplicate of what arrived: no harm, and no reason to exclude the sender
    if (!values.defined() || !r.reducer->add(c.from, c.weight, c.offset, values)) {
      r.reducer->exclude(c.from); // a malformed contribution is no contribution
    }
    maybe_reduce(false);
  } else {
    if (c.part != c.from || r.resolved[c.part] || r.aux)
      return;
    auto size = r.plan.sizes[c.part];
    if (!c.error.empty()) {
      resolve_part(c.part, messages::part_status::failed, "reducer: " + c.error);
    } else if (!values.defined() || c.offset < 0 || values.numel() > size
               || c.offset > size - values.numel()) {
      resolve_part(c.part, messages::part_status::own_value_kept, "malformed result chunk");
    } else if (r.result_ranges[c.part].covers(c.offset, c.offset + values.numel())) {
      return; // a duplicate: counting it again would resolve the part with elements missing
    } else if (auto st = r.result_ranges[c.part].insert(c.offset, c.offset + values.numel());
               !st) {
      resolve_part(c.part, messages::part_status::own_value_kept,
                   "malformed result chunk: " + st.what());
    } else {
      // Straight into the result: a part that ends unaveraged gets the own values back there.
      r.out.narrow(0, r.plan.offsets[c.part] + c.offset, values.numel())
          .copy_(values.to(torch::kFloat32));
      r.result_pieces[c.part].push_back({c.offset, values.numel(), c.contributors});
      if (r.result_ranges[c.part].size() == size) {
        auto segments = merge_pieces(std::move(r.result_pieces[c.part]));
        r.result_pieces[c.part].clear();
        resolve_part(c.part, messages::part_status::averaged, "", common_contributors(segments));
        if (segments.size() > 1)
          r.parts[c.part].segments = std::move(segments);
      }
    }
    check_done();
  }
}

std::vector<uint32_t> averager_impl::contributors_at(int64_t offset) const {
  for (auto& seg : round_->reduced_segments)
    if (offset >= seg.offset && offset < seg.offset + seg.size)
      return seg.contributors;
  return {};
}

void averager_impl::maybe_reduce(bool deadline) {
  if (!round_)
    return;
  auto& r = *round_;
  if (r.reduced || !r.reducer)
    return;
  if (!deadline && !r.reducer->complete())
    return;
  if (opts_.fault == injected_fault::fail_reducing) {
    self_->quit(caf::exit_reason::user_shutdown);
    round_.reset();
    return;
  }
  r.reduced = true;
  for (auto p : r.plan.senders())
    r.reducer->exclude(p); // incomplete ones are cut
  auto out = r.reducer->reduce();
  auto size = r.plan.sizes[r.self];
  std::vector<uint32_t> common;
  if (out) {
    r.reduced_part = std::move(out->values);
    r.reduced_segments = std::move(out->segments);
    common = common_contributors(r.reduced_segments);
    if (!r.aux) {
      r.out.narrow(0, r.plan.offsets[r.self], size).copy_(r.reduced_part);
      resolve_part(r.self, messages::part_status::averaged, "", common);
      if (r.reduced_segments.size() > 1)
        r.parts[r.self].segments = r.reduced_segments;
    }
  } else {
    r.reduce_error = out.error().what;
    if (!r.aux)
      resolve_part(r.self, messages::part_status::failed, "reduction failed: " + r.reduce_error);
  }
  r.reducer.reset(); // free the contributions
  if (r.aux) {
    r.parts[r.self].contributors = common;
    if (r.reduced_segments.size() > 1)
      r.parts[r.self].segments = r.reduced_segments;
    r.parts[r.self].reason = r.reduce_error.empty() ? "auxiliary: reduced for the group"
                                                    : "auxiliary: " + r.reduce_error;
  }
  auto chunk_elems = opts_.chunk_bytes == 0
                         ? std::numeric_limits<int64_t>::max()
                         : std::max<int64_t>(1, static_cast<int64_t>(opts_.chunk_bytes / 4));
  for (uint32_t m = 0; m < r.plan.num_members(); ++m) {
    if (m == r.self || r.gone[m] || r.plan.members[m].auxiliary)
      continue;
    if (client_member(m) && !r.handles[m])
      continue; // it sent us nothing, so we cannot reach it
    auto& s = r.streams[{m, avg_chunk::result}];
    if (!r.reduce_error.empty())
      s.queue.push_back({0, 0});
    else // chunks never straddle a segment: each carries its own contributors
      for (auto& seg : r.reduced_segments)
        for (int64_t off = 0; off < seg.size; off += chunk_elems)
          s.queue.push_back({seg.offset + off, std::min(chunk_elems, seg.size - off)});
    pump(m, avg_chunk::result);
    if (!round_)
      return;
  }
  check_done();
}

void averager_impl::resolve_part(uint32_t part, messages::part_status st, std::string reason,
                                 std::vector<uint32_t> contributors) {
  auto& r = *round_;
  if (r.resolved[part])
    return;
  r.resolved[part] = true;
  auto& pr = r.parts[part];
  pr.status = st;
  pr.reason = std::move(reason);
  pr.contributors = std::move(contributors);
  if (st != messages::part_status::averaged && pr.size > 0) {
    // Own values for the whole part, whatever partial result had arrived.
    r.out.narrow(0, pr.offset, pr.size).copy_(r.flat.narrow(0, pr.offset, pr.size));
  }
}

void averager_impl::member_gone(uint32_t i, const std::string& why) {
  if (!round_)
    return;
  auto& r = *round_;
  if (r.gone[i])
    return;
  r.gone[i] = true;
  r.streams.erase({i, avg_chunk::contribution});
  r.streams.erase({i, avg_chunk::result});
  if (!r.resolved[i])
    resolve_part(i, messages::part_status::own_value_kept,
                 fmt::format("reducer {} {}", r.plan.members[i].address, why));
  if (r.reducer && !r.reduced)
    r.reducer->exclude(i);
  maybe_reduce(false);
  check_done();
}

void averager_impl::check_done() {
  if (!round_)
    return;
  auto& r = *round_;
  bool all = std::all_of(r.resolved.begin(), r.resolved.end(), [](bool b) { return b; });
  if (all && (!r.aux || r.reduced))
    reply_round();
  if (!r.replied || !r.reduced)
    return;
  // Our parts are settled: what we still owe reducers is of no use to anybody.
  for (auto it = r.streams.begin(); it != r.streams.end();)
    it = it->first.second == avg_chunk::contribution ? r.streams.erase(it) : std::next(it);
  for (auto& [k, s] : r.streams)
    if (!s.queue.empty() || s.inflight > 0)
      return;
  end_round();
}

void averager_impl::reply_round() {
  auto& r = *round_;
  if (r.replied)
    return;
  r.replied = true;
  average_result res;
  res.report.group_key = cur_->group_key;
  res.report.group_id = r.id;
  res.report.members = r.plan.members;
  res.report.self = r.self;
  res.report.parts = r.parts;
  finish_report(res.report);
  if (!plane_error_.empty())
    res.report.detail = "data plane unavailable, BASP only: " + plane_error_;
  for (auto m : r.links)
    res.report.plane_links += m == link_mode::plane ? 1 : 0;
  res.report.round_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(self_->clock().now() - r.started)
          .count();
  if (r.aux) {
    res.report.outcome = r.reduce_error.empty() ? messages::round_outcome::complete
                                                : messages::round_outcome::partial;
    res.tensors = cur_->inputs;
  } else {
    int64_t off = 0;
    for (auto& in : cur_->inputs) {
      auto n = in.tensor.numel();
      // Views of the round's result buffer (dropped by the round right after): no copy.
      auto t = r.out.narrow(0, off, n).view(in.tensor.sizes()).to(in.tensor.scalar_type());
      off += n;
      res.tensors.push_back(tensor_msg{t, in.codec, in.params, {}});
    }
  }
  finish_job(std::move(res));
}

void averager_impl::end_round() {
  keep_buffer(out_cache_, std::move(round_->out));
  keep_buffer(reduced_cache_, std::move(round_->reduced_part));
  for (auto& h : round_->handles)
    if (h)
      self_->demonitor(h);
  round_.reset();
  cur_.reset();
  phase_ = phase::idle;
  ++epoch_;
  early_.clear();
  start_next();
}

caf::behavior averager_impl::make_behavior() {
  auto me = shared_from_this();
  self_->set_down_handler([me](caf::down_msg& dm) {
    for (auto it = me->peers_.begin(); it != me->peers_.end();)
      it = it->second.address() == dm.source ? me->peers_.erase(it) : std::next(it);
    if (!me->round_)
      return;
    auto& r = *me->round_;
    for (uint32_t i = 0; i < r.handles.size(); ++i)
      if (r.handles[i] && r.handles[i].address() == dm.source)
        me->member_gone(i, "went down");
  });
  self_->attach_functor([me] {
    if (me->plane_)
      me->plane_->stop();
    me->round_.reset();
    me->queue_.clear();
    me->cur_.reset();
  });
  return {
      [me](average_atom, std::string key, tensor_list tl,
           double weight) -> caf::result<average_result> {
        job j;
        j.group_key = std::move(key);
        j.inputs = std::move(tl.tensors);
        j.weight = weight;
        auto rp = me->self_->make_response_promise();
        j.rp = rp;
        me->enqueue(std::move(j));
        return rp;
      },
      [me](average_atom, stop_atom) { me->cancel(); },
      [me](avg_timer_atom, uint64_t epoch, uint8_t kind) { me->timer(epoch, kind); },
      [me](const avg_join& j) -> avg_join_reply {
        return me->on_join(j, caf::actor_cast<caf::actor>(me->self_->current_sender()));
      },
      [me](const avg_leave& l) { me->on_leave(l); },
      [me](const avg_group& g) { me->on_group(g); },
      [me](avg_chunk& c) { me->on_chunk(c, me->self_->current_sender()); },
      [me](const avg_ack& a) { me->on_ack(a); },
      [me](avg_plane_atom, const std::string& peer)
          -> caf::result<std::string, uint16_t, std::string> {
        if (!me->plane_ || peer.empty() || peer.size() > 1024)
          return {std::string{}, uint16_t{0}, std::string{}};
        return {me->plane_->host(), me->plane_->port(), me->plane_->issue(peer)};
      },
      [me](avg_plane_atom, uint64_t tag, const std::string& peer, avg_chunk& c) {
        if (me->plane_ && tag == me->plane_->tag())
          me->on_plane_chunk(c, peer);
      },
      [me](avg_plane_atom, uint64_t tag, const std::string& peer, const std::string& why) {
        if (me->plane_ && tag == me->plane_->tag())
          me->on_link_lost(peer, why);
      },
  };
}

} // namespace

caf::behavior averager_actor(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                             averager_options opts) {
  if (auto st = validate(opts); !st) {
    self->quit(caf::make_error(caf::sec::invalid_argument, st.what()));
    return {};
  }
  auto impl = std::make_shared<averager_impl>(self, std::move(dht), std::move(resolver),
                                               std::move(opts));
  return impl->make_behavior();
}

caf::actor spawn_averager(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                          averager_options opts) {
  return sys.spawn(averager_actor, std::move(dht), std::move(resolver), std::move(opts));
}

} // namespace starling::actors::averager
