#include "actors/averager/averager.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string_view>

#include <sodium.h>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/averager/codec_choice.hpp"
#include "actors/averager/sparse_parts.hpp"
#include "actors/averager/matchmaker.hpp"
#include "actors/averager/round_engine.hpp"
#include "actors/transfer/transport.hpp"
#include "actors/dht/client.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/dht.hpp"

namespace starling::actors::averager {

using messages::avg_ack;
using messages::avg_chunk;
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

/// The host of an averager's address (`host:port/name`), or empty when it has none.
std::string_view host_of(std::string_view address) {
  auto slash = address.find('/');
  auto endpoint = address.substr(0, slash);
  auto colon = endpoint.rfind(':');
  return colon == std::string_view::npos ? std::string_view{} : endpoint.substr(0, colon);
}

/// Why a request whose input holds NaN or infinity is refused.
constexpr const char* non_finite_input = "the tensors hold non-finite values";

/// Round timers (matchmaking timers use `mm_timer`'s values below these).
constexpr uint8_t t_reduce = 16;
constexpr uint8_t t_round_end = 17;

/// How chunks reach a member: not decided yet (asking for its transport), BASP, direct link.
enum class link_mode : uint8_t { pending, basp, plane };

/// A chunk that arrived before its group message, with how it came.
struct early_chunk {
  avg_chunk chunk;
  /// BASP: the sender to acknowledge.
  caf::strong_actor_ptr sender;
  /// Direct link: the transport id of the link's peer.
  std::string plane_peer;
};

/// Delivers the frames of the averager's channel to the averager (on the links' threads):
///   `(avg_plane_atom, tag, peer, avg_chunk)` a chunk, `(avg_plane_atom, tag, peer, why)` a lost
///   link, `(avg_plane_atom, tag, peer)` a link that came up; peer = the link's transport id.
class avg_channel final : public transfer::channel_handler {
public:
  avg_channel(caf::actor sink, uint64_t tag) : sink_(std::move(sink)), tag_(tag) {}

  status check(const std::string&, const uint8_t*, size_t,
               const kernels::tensor_header& h) override {
    if (h.shape.size() != 1)
      return fail("an averager chunk must be a 1-D tensor");
    return {};
  }

  status deliver(const std::string& peer, std::vector<uint8_t> body,
                 messages::tensor_msg payload) override {
    auto m = decode_chunk_meta(body.data(), body.size());
    if (!m)
      return m.error(); // closes the link: a peer that sends garbage is not one to listen to
    if (!payload.tensor.defined() && m->error.empty())
      return fail("an averager chunk without values or error");
    avg_chunk c;
    c.group_id = m->group_id;
    c.kind = m->kind;
    c.part = m->part;
    c.from = m->from;
    c.weight = m->weight;
    c.offset = m->offset;
    c.contributors = std::move(m->contributors);
    c.error = std::move(m->error);
    c.values = std::move(payload);
    caf::anon_send(sink_, avg_plane_atom::value, tag_, peer, std::move(c));
    return {};
  }

  void link_up(const std::string& peer) override {
    caf::anon_send(sink_, avg_plane_atom::value, tag_, peer);
  }

  void link_lost(const std::string& peer, const std::string& why) override {
    caf::anon_send(sink_, avg_plane_atom::value, tag_, peer, why);
  }

private:
  caf::actor sink_;
  uint64_t tag_;
};

/// What this averager knows of a peer averager's direct transport.
struct peer_link {
  /// Its transport's id (empty: unknown or none).
  std::string id;
  /// Its averager's channel there (0: unknown, or it has no transport).
  uint32_t channel = 0;
  /// The peer's actor when the channel was learned: a restarted averager is asked again.
  caf::actor_addr asked;
};

struct job {
  std::string group_key;
  std::vector<tensor_msg> inputs;
  double weight = 1;
  /// A Top-k round (sparse_parts.hpp) keeping this fraction of each part; 0: a dense round.
  double topk_ratio = 0;
  /// Top-k round: the reducer's error feedback on its re-sparsified parts.
  bool topk_error_feedback = false;
  caf::response_promise rp;
  at::Tensor flat;
  caf::actor_clock::time_point started;
  /// `flat` was checked for non-finite values (after the join went out, or when the round
  /// starts), and what the check found.
  bool checked = false;
  bool finite = true;
};

class shell;

/// The engine's sink: each chunk leaves over the member's data-plane link or over BASP.
class link_sink final : public round_sink {
public:
  explicit link_sink(shell& s) : shell_(s) {}
  void send(uint32_t to, const out_chunk_ptr& c) override;

private:
  shell& shell_;
};

/// One running round: the engine and how its members are reached.
struct round_state {
  std::unique_ptr<link_sink> sink;
  std::unique_ptr<round_engine> engine;
  std::vector<messages::member_info> members;
  std::vector<caf::actor> handles;
  std::vector<link_mode> links;
  /// Result chunks' payloads for the direct links, encoded once for every receiver.
  std::map<const out_chunk*, std::shared_ptr<transfer::outgoing_payload>> shared;
  caf::actor_clock::time_point started;
  bool replied = false;
  /// The codec of this round's chunks (adaptive: chosen at its start).
  kernels::codec_id codec = kernels::codec_id::none;
  /// What the choice saw (codec_chooser::describe), for the report, and the vector's elements.
  std::string choice;
  int64_t elements = 0;
  /// A Top-k round: chunks travel as `sparse_chunk` bytes over BASP; the bytes of chunk values
  /// sent and received (round_report::topk_bytes_*).
  bool sparse = false;
  uint64_t sparse_sent = 0;
  uint64_t sparse_received = 0;
};

class shell : public std::enable_shared_from_this<shell> {
public:
  shell(caf::event_based_actor* self, caf::actor dht, caf::actor resolver, averager_options opts)
    : self_(self), dht_(std::move(dht)), resolver_(std::move(resolver)), opts_(std::move(opts)),
      mm_(matchmaker_options{opts_.address, opts_.bandwidth, opts_.auxiliary,
                             opts_.target_group_size, opts_.key_prefix,
                             opts_.matchmaking_window, opts_.poll_interval, opts_.join_grace,
                             opts_.persistent_groups, opts_.family_groups}) {
    transport_ = opts_.transport;
    if (!transport_ && !opts_.data_host.empty()) {
      transfer::transport_options to;
      to.host = opts_.data_host;
      to.io_timeout =
          std::chrono::duration_cast<std::chrono::milliseconds>(opts_.data_io_timeout);
      // Each incoming link holds at most `link_buffers` (2) delivered chunks at once (plus one
      // being read): the weighted mean adds a chunk and drops it, so a round needs about three
      // buffers per link, which the pool keeps for the next round (fresh pages are expensive).
      to.pool_buffers = 32;
      to.security = opts_.data_security;
      auto t = transfer::transport::open(to);
      if (t) {
        transport_ = std::move(*t);
        own_transport_ = true;
      } else {
        transport_error_ = t.error().what; // BASP only; said in every round's report
      }
    }
    if (opts_.adaptive_codec) {
      codec_choice_options co;
      co.candidates = opts_.codec_candidates;
      co.error_budget = opts_.codec_error_budget;
      chooser_.emplace(co);
    }
    if (transport_) {
      randombytes_buf(&tag_, sizeof tag_);
      channel_ = transport_->add_channel(
          std::make_shared<avg_channel>(caf::actor_cast<caf::actor>(self_), tag_));
    }
  }

  caf::behavior make_behavior();

  /// Sends one engine chunk to member `to` (the sink's work).
  void send_chunk(uint32_t to, const out_chunk_ptr& c);

private:
  // -- jobs ------------------------------------------------------------------------------------
  void start_next();
  /// Checks the current job's input for non-finite values once; true when it has none.
  bool check_input();
  void finish_job(average_result res);
  void fail_job(const std::string& why, messages::round_outcome outcome);
  average_result unchanged_result(messages::round_outcome outcome, const std::string& why);
  void cancel();
  /// Cancels the request for `key` (running or queued); others go on.
  void cancel(const std::string& key);
  messages::member_info me() const { return {opts_.address, opts_.bandwidth, opts_.auxiliary}; }

  // -- matchmaking effects ---------------------------------------------------------------------
  void apply(std::vector<mm_effect> effects);
  void with_peer(const std::string& address, std::function<void(caf::actor)> ok,
                 std::function<void()> err);

  // -- round -------------------------------------------------------------------------------------
  void start_round(uint64_t id, std::vector<messages::member_info> members);
  void open_link(uint32_t member, const caf::actor& handle);
  /// A client-mode member of the round (nobody resolves or connects to it) reached us over a
  /// link it opened: `handle` is its averager as that link shows it.
  void adopt_client(uint32_t member, const caf::actor& handle);
  bool client_member(uint32_t member) const { return round_->members[member].bandwidth == 0; }
  void on_chunk(avg_chunk& c, const caf::strong_actor_ptr& sender);
  void on_plane_chunk(avg_chunk& c, const std::string& peer);
  void deliver(const avg_chunk& c);
  void on_link_lost(const std::string& peer, const std::string& why);
  void on_link_up(const std::string& peer);
  /// Starts sending to member `i` over its direct link.
  void use_link(uint32_t i);
  /// Replies once the engine is ready and ends the round once it is finished.
  void progress();
  void reply_round();
  void end_round();

  caf::event_based_actor* self_;
  caf::actor dht_;
  caf::actor resolver_;
  averager_options opts_;
  matchmaker mm_;
  std::map<std::string, caf::actor> peers_;
  /// The leaders our joins went to in this matchmaking (handle -> address), monitored: a leader
  /// that dies while we wait for its answer or its group is left at once (`on_leave`), instead
  /// of after the window and `join_grace` (its followers then each stepped alone: a SIGKILLed
  /// data-parallel peer that led the family's group cost the others 3 s and a resync).
  std::map<caf::actor_addr, std::string> mm_watch_;
  /// Addresses of client-mode peers: never resolved (nobody connects to a client); reached only
  /// over a handle it gave us by messaging us (a join, a chunk, a link request).
  std::set<std::string> clients_;
  std::shared_ptr<transfer::transport> transport_;
  bool own_transport_ = false;
  std::string transport_error_;
  /// Our channel on the transport, and the tag its deliveries carry (a remote node could send
  /// the same messages over BASP).
  uint32_t channel_ = 0;
  uint64_t tag_ = 0;
  /// Peer averagers' transports, by averager address.
  std::map<std::string, peer_link> remotes_;
  /// Result and reduced-part buffers of earlier rounds, reused once nobody else holds them:
  /// fresh pages cost more than the copies themselves (a 16 MiB copy into new memory took
  /// 100-200 ms on this VM, page faults included).
  std::vector<at::Tensor> out_cache_;
  std::vector<at::Tensor> reduced_cache_;
  /// Lost or refused direct links per peer averager; from `max_link_failures` on, BASP only.
  std::map<std::string, int> link_failures_;
  static constexpr int max_link_failures = 3;

  std::deque<job> queue_;
  std::optional<job> cur_;
  /// Joins waiting for the matchmaker's answer, by ticket: the promise and the joiner's handle.
  std::map<uint64_t, std::pair<caf::response_promise, caf::actor>> tickets_;
  std::map<uint64_t, std::string> ticket_addresses_;
  uint64_t next_ticket_ = 1;
  std::vector<early_chunk> early_;
  std::optional<round_state> round_;
  /// Bumped per round: round timers and resolves of older rounds are ignored.
  uint64_t round_epoch_ = 0;
  /// `adaptive_codec`: the choice, fed with codec profiles and link throughput.
  std::optional<codec_chooser> chooser_;
  /// Top-k rounds: the reducer's error feedback over the whole vector (sparse_parts.hpp).
  std::optional<sparse_part_finisher> finisher_;
  /// `codec: auto`: the chooser's round count when the codecs were last profiled.
  uint64_t profiled_at_ = 0;
  static constexpr uint64_t profile_every = 16;
};

void link_sink::send(uint32_t to, const out_chunk_ptr& c) {
  shell_.send_chunk(to, c);
}

// -- helpers -------------------------------------------------------------------------------------

/// A fp32 buffer of `n` elements from `cache` that nobody else references, or an undefined one.
at::Tensor take_buffer(std::vector<at::Tensor>& cache, int64_t n) {
  for (auto it = cache.begin(); it != cache.end(); ++it)
    if (it->numel() == n && it->use_count() == 1 && it->storage().use_count() == 1) {
      auto t = std::move(*it);
      cache.erase(it);
      return t;
    }
  return {};
}

/// Keeps `t` for reuse (at most two per cache: a caller may still hold the previous result).
void keep_buffer(std::vector<at::Tensor>& cache, at::Tensor t) {
  if (!t.defined() || t.numel() == 0)
    return;
  cache.push_back(std::move(t));
  if (cache.size() > 2)
    cache.erase(cache.begin());
}

void shell::with_peer(const std::string& address, std::function<void(caf::actor)> ok,
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

average_result shell::unchanged_result(messages::round_outcome outcome, const std::string& why) {
  average_result res;
  res.tensors = cur_->inputs;
  res.report.group_key = cur_->group_key;
  res.report.members = {me()};
  res.report.outcome = outcome;
  res.report.detail = why;
  return res;
}

void shell::finish_job(average_result res) {
  if (!cur_)
    return;
  res.report.elapsed_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(self_->clock().now() - cur_->started)
          .count();
  cur_->rp.deliver(std::move(res));
}

void shell::fail_job(const std::string& why, messages::round_outcome outcome) {
  finish_job(unchanged_result(outcome, why));
  apply(mm_.finish());
  cur_.reset();
  early_.clear();
  start_next();
}

void shell::start_next() {
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
      } catch (const std::exception& e) {
        why = fmt::format("flattening failed: {}", e.what());
      }
    }
    if (!why.empty()) {
      finish_job(unchanged_result(messages::round_outcome::error, why));
      cur_.reset();
      continue;
    }
    early_.clear();
    auto now = self_->clock().now().time_since_epoch();
    auto epoch = round_epoch_;
    mm_watch_.clear();
    apply(mm_.start(cur_->group_key, cur_->flat.numel(),
                    std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    // The pass over the whole input runs while our join travels to the leader (it took 3-13 ms
    // of every round's matchmaking at 16M floats when it ran first). A group formed at once
    // (our request was the last one its leader waited for) checks it in start_round.
    if (cur_ && !cur_->checked && !round_ && round_epoch_ == epoch)
      check_input();
  }
}

bool shell::check_input() {
  if (!cur_->checked) {
    cur_->checked = true;
    cur_->finite = all_finite(cur_->flat);
  }
  return cur_->finite;
}

void shell::cancel() {
  if (!cur_)
    return;
  cur_->rp.deliver(caf::make_error(caf::sec::request_timeout, "averaging cancelled"));
  if (round_) {
    messages::avg_leave l{cur_->group_key, opts_.address, std::string{}};
    for (uint32_t i = 0; i < round_->members.size(); ++i)
      if (round_->members[i].address != opts_.address)
        with_peer(round_->members[i].address, [this, l](caf::actor a) { self_->send(a, l); },
                  [] {});
    for (auto& h : round_->handles)
      if (h)
        self_->demonitor(h);
    round_.reset();
    ++round_epoch_;
  }
  apply(mm_.finish());
  cur_.reset();
  early_.clear();
  start_next();
}

void shell::cancel(const std::string& key) {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->group_key == key) {
      it->rp.deliver(caf::make_error(caf::sec::request_timeout, "averaging cancelled"));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (cur_ && cur_->group_key == key)
    cancel();
}

// -- matchmaking effects -------------------------------------------------------------------------

void shell::apply(std::vector<mm_effect> effects) {
  auto weak = weak_from_this();
  for (auto& e : effects) {
    if (auto* a = std::get_if<mm::announce>(&e)) {
      auto put = dht::make_subkey_put(
          a->key, opts_.address, a->value,
          dht::expires_in(self_, std::chrono::duration_cast<caf::timespan>(a->ttl)));
      dht::dht_store(
          self_, dht_, std::move(put), opts_.rpc_timeout, [](const messages::dht_put_result&) {},
          [](caf::error&) {});
    } else if (auto* p = std::get_if<mm::poll>(&e)) {
      auto epoch = mm_.epoch();
      dht::dht_get(
          self_, dht_, p->key, opts_.rpc_timeout,
          [weak, epoch](const messages::dht_get_result& r) {
            auto me = weak.lock();
            if (!me || me->mm_.epoch() != epoch)
              return;
            std::vector<announcement> recs;
            for (auto& rec : r.records)
              if (rec.has_subkey)
                recs.push_back({rec.subkey, rec.value, rec.expiration_ns});
            me->apply(me->mm_.on_records(recs));
          },
          [](caf::error&) {});
    } else if (auto* j = std::get_if<mm::send_join>(&e)) {
      auto leader = j->to;
      auto epoch = j->epoch;
      auto join = j->join;
      auto failed = [weak, epoch, leader](const std::string& why) {
        if (auto me = weak.lock())
          me->apply(me->mm_.on_join_failed(epoch, leader, why));
      };
      with_peer(
          leader,
          [this, weak, epoch, leader, join, failed](caf::actor a) {
            if (mm_.matching() && mm_.epoch() == epoch
                && mm_watch_.emplace(a.address(), leader).second)
              self_->monitor(a);
            self_->request(a, opts_.rpc_timeout, join)
                .then(
                    [weak, epoch, leader](const messages::avg_join_reply& r) {
                      if (auto me = weak.lock())
                        me->apply(me->mm_.on_join_reply(epoch, leader, r));
                    },
                    [failed](caf::error& err) { failed(caf::to_string(err)); });
          },
          [failed] { failed("unresolvable"); });
    } else if (auto* l = std::get_if<mm::send_leave>(&e)) {
      auto leave = l->leave;
      with_peer(l->to, [this, leave](caf::actor a) { self_->send(a, leave); }, [] {});
    } else if (auto* g = std::get_if<mm::send_group>(&e)) {
      auto group = g->group;
      with_peer(g->to, [this, group](caf::actor a) { self_->send(a, group); }, [] {});
    } else if (auto* a = std::get_if<mm::answer_join>(&e)) {
      auto it = tickets_.find(a->ticket);
      if (it == tickets_.end())
        continue;
      // The joiner's handle as we see it: the group message then leaves synchronously when the
      // group closes (a leader that fails right after still informs everyone).
      if (a->reply.verdict == messages::avg_join_reply::accepted && it->second.second)
        peers_[ticket_addresses_[a->ticket]] = it->second.second;
      it->second.first.deliver(a->reply);
      tickets_.erase(it);
      ticket_addresses_.erase(a->ticket);
    } else if (auto* t = std::get_if<mm::set_timer>(&e)) {
      self_->delayed_send(self_, std::chrono::duration_cast<caf::timespan>(t->delay),
                          avg_timer_atom::value, t->epoch, static_cast<uint8_t>(t->kind));
    } else if (auto* f = std::get_if<mm::formed>(&e)) {
      start_round(f->group_id, f->members);
    } else if (auto* g = std::get_if<mm::gave_up>(&e)) {
      if (cur_ && !check_input())
        fail_job(non_finite_input, messages::round_outcome::error);
      else
        fail_job(g->why, messages::round_outcome::no_partner);
      return; // the next job's effects were applied by fail_job
    }
  }
}

// -- round ---------------------------------------------------------------------------------------

void shell::start_round(uint64_t id, std::vector<messages::member_info> members) {
  if (!check_input()) {
    // Formed with us, who cannot contribute: the others go on without us at once.
    messages::avg_leave l{cur_->group_key, opts_.address, std::string{}};
    for (auto& m : members)
      if (m.address != opts_.address)
        with_peer(m.address, [this, l](caf::actor a) { self_->send(a, l); }, [] {});
    fail_job(non_finite_input, messages::round_outcome::error);
    return;
  }
  auto plan = make_plan(members, cur_->flat.numel(), opts_.min_part);
  if (!plan) {
    fail_job("cannot plan the round: " + plan.error().what, messages::round_outcome::error);
    return;
  }
  auto n = static_cast<uint32_t>(members.size());
  uint32_t self = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (members[i].address == opts_.address)
      self = i;
  ++round_epoch_;
  round_.emplace();
  auto& r = *round_;
  r.started = self_->clock().now();
  r.members = members;
  r.handles.resize(n);
  r.links.assign(n, link_mode::pending);
  r.sink = std::make_unique<link_sink>(*this);
  r.codec = opts_.codec;
  if (chooser_) {
    // Links still open from an earlier round tell whether every member is on this host (then
    // compression only adds work); a member not linked yet is on this host when its address
    // names this averager's host (the link the round opens to it will be a same-host one), so
    // that a first round on one host is not compressed and profiled for nothing.
    bool local = transport_ && n > 1;
    auto own_host = host_of(opts_.address);
    for (uint32_t i = 0; i < n && local; ++i) {
      if (i == self)
        continue;
      auto it = remotes_.find(members[i].address);
      bool linked = it != remotes_.end() && it->second.channel != 0;
      local = members[i].bandwidth != 0
              && link_failures_[members[i].address] < max_link_failures
              && (linked ? transport_->local_link(it->second.id)
                         : !own_host.empty() && host_of(members[i].address) == own_host);
    }
    // Profiles on a slice of this round's vector (its data decide the errors), then the
    // choice. Profiling costs the round its time (3 timings of each codec on 64K elements: 30%
    // of a 2-process 16M-float round on one host), so it is skipped where the links decide
    // (same host) and refreshed every `profile_every` rounds otherwise.
    if (!local && cur_->flat.numel() > 0
        && (!chooser_->profiled() || chooser_->rounds() >= profiled_at_ + profile_every)) {
      auto sample = cur_->flat.narrow(0, 0, std::min<int64_t>(cur_->flat.numel(), 1 << 16));
      auto now = [] {
        return std::chrono::duration<double>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
      };
      for (auto c : opts_.codec_candidates)
        if (auto p = measure_codec(sample, c, opts_.codec_params, now); p)
          chooser_->set_profile(*p);
      profiled_at_ = chooser_->rounds();
    }
    chooser_->set_links_local(local);
    r.codec = chooser_->choose(cur_->flat.numel(), n);
    r.choice = chooser_->describe(cur_->flat.numel(), n);
    r.elements = cur_->flat.numel();
  }
  round_engine_options eo;
  eo.chunk_elems = opts_.chunk_bytes == 0
                       ? std::numeric_limits<int64_t>::max()
                       : std::max<int64_t>(1, static_cast<int64_t>(opts_.chunk_bytes / 4));
  eo.reducer = opts_.reducer;
  eo.hash_parts = opts_.hash_parts;
  eo.input_finite = true; // start_next checked the flat vector
  if (cur_->topk_ratio > 0) {
    // Top-k parts: the members' vectors are sparse already and travel as their nonzeros; this
    // reducer re-sparsifies its part with its own residual over the whole vector. A chunk
    // carries about `chunk_bytes` of nonzeros, not of elements.
    r.sparse = true;
    r.codec = kernels::codec_id::none;
    if (!finisher_ || finisher_->ratio() != cur_->topk_ratio
        || finisher_->error_feedback() != cur_->topk_error_feedback)
      finisher_.emplace(cur_->topk_ratio, cur_->topk_error_feedback);
    auto numel = cur_->flat.numel();
    r.elements = numel;
    eo.finish_part = [this, numel](int64_t offset, at::Tensor& values) {
      return finisher_->finish(numel, offset, values);
    };
    auto scaled = static_cast<double>(eo.chunk_elems) / cur_->topk_ratio;
    eo.chunk_elems = scaled >= 4.0e18 ? std::numeric_limits<int64_t>::max()
                                      : static_cast<int64_t>(scaled);
  }
  auto own = plan->sizes[self];
  r.engine = std::make_unique<round_engine>(
      id, std::move(*plan), self, cur_->flat, cur_->weight, std::move(eo), *r.sink,
      opts_.in_place ? cur_->flat : take_buffer(out_cache_, cur_->flat.numel()),
      take_buffer(reduced_cache_, own));
  auto e = round_epoch_;
  self_->delayed_send(self_,
                      std::chrono::duration_cast<caf::timespan>(opts_.round_timeout
                                                                * opts_.reduce_fraction),
                      avg_timer_atom::value, e, t_reduce);
  self_->delayed_send(self_, opts_.round_timeout, avg_timer_atom::value, e, t_round_end);
  // Resolve and monitor every other member, then open its link.
  for (uint32_t i = 0; i < n; ++i) {
    if (i == self)
      continue;
    if (members[i].bandwidth == 0 && members[i].address != opts_.address) {
      // Nobody connects to a client: we reach it over the handle it gave us when it joined (the
      // leader's case) or with its first message of this round (a chunk or a link request).
      clients_.insert(members[i].address);
      if (auto it = peers_.find(members[i].address); it != peers_.end()) {
        adopt_client(i, it->second);
      } else if (members[self].bandwidth == 0) {
        // Two clients: neither reduces a part, so nothing passes between them.
        r.links[i] = link_mode::basp;
        r.engine->open(i, opts_.window);
      }
      if (!round_ || round_epoch_ != e)
        return;
      continue;
    }
    with_peer(
        members[i].address,
        [this, e, i](caf::actor a) {
          if (!round_ || round_epoch_ != e || round_->engine->gone(i))
            return;
          round_->handles[i] = a;
          self_->monitor(a);
          open_link(i, a);
          progress(); // an open link may let the round finish
        },
        [this, e, i] {
          if (round_ && round_epoch_ == e) {
            round_->engine->member_gone(i, "could not be resolved");
            progress();
          }
        });
    if (!round_ || round_epoch_ != e)
      return;
  }
  // Chunks that arrived before the group message.
  auto early = std::move(early_);
  early_.clear();
  for (auto& c : early) {
    if (!round_ || round_epoch_ != e)
      break;
    if (c.plane_peer.empty())
      on_chunk(c.chunk, c.sender);
    else
      on_plane_chunk(c.chunk, c.plane_peer);
  }
  progress();
}

void shell::open_link(uint32_t i, const caf::actor& handle) {
  auto& r = *round_;
  auto addr = r.members[i].address;
  auto e = round_epoch_;
  if (!transport_ || link_failures_[addr] >= max_link_failures) {
    r.links[i] = link_mode::basp;
    r.engine->open(i, opts_.window);
    return;
  }
  // Known from an earlier round (same actor, link still open): no question to ask.
  if (auto it = remotes_.find(addr); it != remotes_.end() && it->second.channel != 0
                                   && it->second.asked == handle.address()
                                   && transport_->linked(it->second.id)) {
    use_link(i);
    return;
  }
  self_->request(handle, opts_.rpc_timeout, avg_plane_atom::value, opts_.address,
                 transport_->id())
      .then(
          [this, e, i, addr, handle](std::string& id, std::string& host, uint16_t port,
                                     std::string& token, uint32_t channel) {
            auto& info = remotes_[addr];
            info.id = id;
            info.channel = channel;
            info.asked = handle.address();
            bool linked = false;
            if (channel == 0 || id.empty()) {
              link_failures_[addr] = max_link_failures; // the peer has no transport
            } else if (transport_->linked(id)) {
              linked = true;
            } else if (port != 0) {
              if (auto st = transport_->connect(id, host, port, token); st)
                linked = true;
              else
                ++link_failures_[addr];
            } // else: a client-mode peer, reached once it opened its link to us (on_link_up)
            if (!round_ || round_epoch_ != e || round_->engine->gone(i))
              return;
            if (linked) {
              use_link(i);
            } else {
              round_->links[i] = link_mode::basp;
              round_->engine->open(i, opts_.window);
            }
            progress();
          },
          [this, e, i, addr](caf::error&) {
            ++link_failures_[addr];
            if (!round_ || round_epoch_ != e || round_->engine->gone(i))
              return;
            round_->links[i] = link_mode::basp;
            round_->engine->open(i, opts_.window);
            progress();
          });
}

void shell::adopt_client(uint32_t i, const caf::actor& handle) {
  auto& r = *round_;
  if (!handle || r.handles[i] || r.engine->gone(i))
    return;
  r.handles[i] = handle;
  peers_[r.members[i].address] = handle;
  self_->monitor(handle);
  // Our chunks to it go back over the connection it opened (its own chunks to us take its
  // direct link to our transport when it has one).
  if (r.links[i] == link_mode::pending) {
    r.links[i] = link_mode::basp;
    r.engine->open(i, opts_.window);
  }
}

void shell::use_link(uint32_t i) {
  round_->links[i] = link_mode::plane;
  round_->engine->open(i, 0); // TCP paces the link
}

void shell::send_chunk(uint32_t to, const out_chunk_ptr& c) {
  auto& r = *round_;
  // Top-k rounds send their small chunks packed over BASP; a direct link (dense, lossless too)
  // only where BASP has no handle to the member.
  if (r.links[to] == link_mode::plane && !(r.sparse && r.handles[to])) {
    if (r.sparse && c->values.defined())
      r.sparse_sent += static_cast<uint64_t>(c->values.numel()) * 4;
    auto& info = remotes_[r.members[to].address];
    std::shared_ptr<transfer::outgoing_payload> payload;
    if (c->values.defined()) {
      if (c->meta.kind == result_chunk) { // one encoding for every receiver
        auto& shared = r.shared[c.get()];
        if (!shared)
          shared = std::make_shared<transfer::outgoing_payload>(c->values, r.codec,
                                                                opts_.codec_params);
        payload = shared;
      } else {
        payload = std::make_shared<transfer::outgoing_payload>(c->values, r.codec,
                                                               opts_.codec_params);
      }
    }
    auto meta = encode_chunk_meta(c->meta);
    if (meta && transport_->send(info.id, std::make_shared<transfer::outgoing_frame>(
                                              info.channel, *meta, std::move(payload))))
      return;
    // The link died since this round chose it: this chunk takes BASP, and the lost-link report
    // reopens the member with a credit window.
    r.links[to] = link_mode::basp;
  }
  if (!r.handles[to])
    return;
  avg_chunk m;
  m.group_id = c->meta.group_id;
  m.kind = c->meta.kind;
  m.part = c->meta.part;
  m.from = c->meta.from;
  m.weight = c->meta.weight;
  m.offset = c->meta.offset;
  m.contributors = c->meta.contributors;
  m.error = c->meta.error;
  if (c->values.defined() && r.sparse) {
    if (auto packed = encode_sparse_chunk(c->values); packed) {
      m.encoded.assign(packed->begin(), packed->end());
      r.sparse_sent += m.encoded.size();
    } else { // not expected (the values are finite): the receiver refuses it as malformed
      m.encoded.clear();
    }
  } else if (c->values.defined()) {
    tensor_msg tm{c->values, r.codec, opts_.codec_params, {}};
    if (r.codec == kernels::codec_id::none) {
      m.values = std::move(tm);
    } else if (auto st = messages::save_tensor(tm, m.encoded); !st) {
      // A codec that cannot encode this chunk (e.g. out of range): send it uncompressed.
      m.encoded.clear();
      m.values = tensor_msg{c->values, kernels::codec_id::none, {}, {}};
    }
  }
  self_->send(r.handles[to], std::move(m));
}

void shell::on_chunk(avg_chunk& c, const caf::strong_actor_ptr& sender) {
  // A chunk whose envelope was refused names no round it belongs to (counted by the wire
  // context): kept for later it would only take a slot of the early chunks.
  if (!c.wire_error.empty())
    return;
  if (!round_ || c.group_id != round_->engine->id()) {
    if (mm_.matching() && early_.size() < 4096)
      early_.push_back(early_chunk{std::move(c), sender, {}});
    return;
  }
  auto& e = *round_->engine;
  if (c.from >= e.plan().num_members() || c.from == e.self() || e.gone(c.from))
    return;
  if (client_member(c.from) && !round_->handles[c.from] && sender) {
    adopt_client(c.from, caf::actor_cast<caf::actor>(sender)); // answered over its link
    if (!round_)
      return;
  }
  // Ack first: the credit goes back whatever the engine makes of the chunk. (To the message's
  // sender: our handle to that member may not be resolved yet.)
  if (auto to = caf::actor_cast<caf::actor>(sender))
    self_->send(to, avg_ack{c.group_id, c.kind, c.part, e.self()});
  deliver(c);
}

void shell::on_plane_chunk(avg_chunk& c, const std::string& peer) {
  if (!round_ || c.group_id != round_->engine->id()) {
    if (mm_.matching() && early_.size() < 4096) {
      // Kept past this handler: copied, so that the link's receive slot is free again.
      if (c.values.tensor.defined())
        c.values.tensor = c.values.tensor.clone();
      early_.push_back(early_chunk{std::move(c), nullptr, peer});
    }
    return;
  }
  // A chunk must come over a link to the transport its sender named when it asked us.
  if (c.from >= round_->members.size())
    return;
  auto it = remotes_.find(round_->members[c.from].address);
  if (it == remotes_.end() || it->second.id != peer)
    return;
  deliver(c);
}

void shell::deliver(const avg_chunk& c) {
  at::Tensor values;
  auto& r = *round_;
  if (c.error.empty() && r.sparse) {
    if (!c.encoded.empty()) {
      r.sparse_received += c.encoded.size();
      auto bytes = reinterpret_cast<const uint8_t*>(c.encoded.data());
      if (auto t = decode_sparse_chunk(bytes, c.encoded.size(), r.elements); t)
        values = std::move(*t);
    } else if (c.values.ok() && c.values.tensor.defined()) { // over a direct link
      values = c.values.tensor;
      r.sparse_received += static_cast<uint64_t>(values.numel()) * 4;
    }
  } else if (c.error.empty()) {
    if (!c.encoded.empty()) {
      tensor_msg tm;
      if (auto st = messages::load_tensor(c.encoded, tm); st)
        values = tm.tensor;
    } else if (c.values.ok() && c.values.tensor.defined()) {
      values = c.values.tensor;
    }
  }
  chunk_meta m;
  m.group_id = c.group_id;
  m.kind = c.kind;
  m.part = c.part;
  m.from = c.from;
  m.weight = c.weight;
  m.offset = c.offset;
  m.contributors = c.contributors;
  m.error = c.error;
  round_->engine->on_chunk(m, values);
  progress();
}

void shell::on_link_lost(const std::string& peer, const std::string&) {
  for (auto& [addr, info] : remotes_)
    if (info.id == peer)
      ++link_failures_[addr];
  if (!round_)
    return;
  // What was queued on the link is lost (the round's rules cover it); later chunks take BASP.
  auto& r = *round_;
  for (uint32_t i = 0; i < r.members.size(); ++i)
    if (r.links[i] == link_mode::plane && remotes_[r.members[i].address].id == peer) {
      r.links[i] = link_mode::basp;
      r.engine->open(i, opts_.window);
    }
  progress();
}

void shell::on_link_up(const std::string& peer) {
  if (!round_)
    return;
  // A client-mode member opened its link to us: our chunks to it take that link from now on.
  auto& r = *round_;
  for (uint32_t i = 0; i < r.members.size(); ++i) {
    auto it = remotes_.find(r.members[i].address);
    if (r.links[i] == link_mode::basp && it != remotes_.end() && it->second.id == peer
        && it->second.channel != 0 && !r.engine->gone(i))
      use_link(i);
  }
  progress();
}

void shell::progress() {
  if (!round_)
    return;
  if (round_->engine->ready() && !round_->replied)
    reply_round();
  if (round_ && round_->engine->finished())
    end_round();
}

void shell::reply_round() {
  auto& r = *round_;
  r.replied = true;
  auto& e = *r.engine;
  auto result = e.result();
  average_result res;
  res.report.group_key = cur_->group_key;
  res.report.group_id = e.id();
  res.report.members = r.members;
  res.report.self = e.self();
  res.report.parts = std::move(result.parts);
  res.report.received = std::move(result.received);
  finish_report(res.report);
  if (!transport_error_.empty())
    res.report.detail = "direct transport unavailable, BASP only: " + transport_error_;
  if (chooser_) // which codec `auto` took (the report has no field of its own for it yet)
    res.report.detail += (res.report.detail.empty() ? "" : "; ") + std::string{"codec auto: "}
                         + std::string{kernels::to_string(r.codec)} + " (" + r.choice + ")";
  for (auto m : r.links)
    res.report.plane_links += m == link_mode::plane ? 1 : 0;
  res.report.topk_bytes_sent = r.sparse_sent;
  res.report.topk_bytes_received = r.sparse_received;
  res.report.round_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(self_->clock().now() - r.started)
          .count();
  if (e.auxiliary()) {
    res.tensors = cur_->inputs;
  } else {
    int64_t off = 0;
    for (auto& in : cur_->inputs) {
      auto n = in.tensor.numel();
      // Views of the round's result buffer (kept for reuse only once nobody holds them).
      auto t = result.values.narrow(0, off, n).view(in.tensor.sizes()).to(in.tensor.scalar_type());
      off += n;
      res.tensors.push_back(tensor_msg{t, in.codec, in.params, {}});
    }
  }
  finish_job(std::move(res));
}

void shell::end_round() {
  auto& r = *round_;
  auto [out, reduced] = r.engine->buffers();
  // The members that stayed are remembered as the group (persistent groups; the matchmaker
  // forgets a group of fewer than two). Forgetting the whole group when one member went (the old
  // rule) made the survivors' next request match through the DHT, so their leader waited out the
  // matchmaking window before every survivor's first round after a SIGKILL. A member that was
  // only slow and comes back announces itself and joins as a newcomer (family groups wait for
  // it) or late (remembered with the group for the round after).
  std::vector<messages::member_info> members;
  for (uint32_t i = 0; i < r.members.size(); ++i)
    if (i == r.engine->self() || !r.engine->gone(i))
      members.push_back(r.members[i]);
  if (chooser_) {
    // The round's time with its codec (codec_chooser::observe_round), which also measures the
    // links: the bytes it moved over its duration. The time the link threads spent in writes
    // is no measure (a write returns once the socket's buffer took the bytes: on 200 Mbit/s
    // links it read 3.7-18 GB/s and sent `auto` to fp16, 1.8x slower than blockwise8 there).
    chooser_->observe_round(r.codec, r.elements, r.members.size(),
                            std::chrono::duration<double>(self_->clock().now() - r.started)
                              .count());
  }
  for (auto& h : r.handles)
    if (h)
      self_->demonitor(h);
  round_.reset();
  ++round_epoch_;
  // (A result written in place is the caller's vector: not ours to reuse.)
  if (!cur_->flat.defined() || out.data_ptr() != cur_->flat.data_ptr())
    keep_buffer(out_cache_, std::move(out));
  keep_buffer(reduced_cache_, std::move(reduced));
  apply(mm_.finish(std::move(members)));
  cur_.reset();
  early_.clear();
  start_next();
}

caf::behavior shell::make_behavior() {
  auto me = shared_from_this();
  self_->set_down_handler([me](caf::down_msg& dm) {
    for (auto it = me->peers_.begin(); it != me->peers_.end();)
      it = it->second.address() == dm.source ? me->peers_.erase(it) : std::next(it);
    if (auto w = me->mm_watch_.find(dm.source); w != me->mm_watch_.end()) {
      messages::avg_leave gone;
      gone.address = w->second;
      me->mm_watch_.erase(w);
      if (me->mm_.matching()) {
        gone.group_key = me->mm_.group_key();
        me->apply(me->mm_.on_leave(gone));
      }
    }
    if (!me->round_)
      return;
    auto& r = *me->round_;
    for (uint32_t i = 0; i < r.handles.size(); ++i)
      if (r.handles[i] && r.handles[i].address() == dm.source)
        r.engine->member_gone(i, "went down");
    me->progress();
  });
  self_->set_exit_handler([me](caf::exit_msg& m) {
    if (!m.reason)
      return;
    if (m.reason == caf::exit_reason::user_shutdown) {
      // Its peer leaves on purpose: tell the group before going (a leader in matchmaking hands
      // its followers on, a running round's members stop waiting for our parts).
      me->queue_.clear();
      me->cancel();
    }
    me->self_->quit(m.reason);
  });
  self_->attach_functor([me] {
    if (me->transport_) {
      me->transport_->remove_channel(me->channel_);
      if (me->own_transport_)
        me->transport_->stop();
    }
    me->round_.reset();
    me->queue_.clear();
    me->cur_.reset();
    me->tickets_.clear();
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
        me->queue_.push_back(std::move(j));
        if (!me->cur_)
          me->start_next();
        return rp;
      },
      [me](average_atom, std::string key, tensor_list tl, double weight, double topk_ratio,
           bool error_feedback) -> caf::result<average_result> {
        if (!(topk_ratio > 0 && topk_ratio <= 1))
          return caf::make_error(caf::sec::invalid_argument,
                                 fmt::format("a Top-k round keeps a fraction in (0, 1] of each "
                                             "part, got {}", topk_ratio));
        job j;
        j.group_key = std::move(key);
        j.inputs = std::move(tl.tensors);
        j.weight = weight;
        j.topk_ratio = topk_ratio;
        j.topk_error_feedback = error_feedback;
        auto rp = me->self_->make_response_promise();
        j.rp = rp;
        me->queue_.push_back(std::move(j));
        if (!me->cur_)
          me->start_next();
        return rp;
      },
      [me](average_atom, stop_atom) { me->cancel(); },
      [me](average_atom, stop_atom, const std::string& key) { me->cancel(key); },
      [me](avg_timer_atom, uint64_t epoch, uint8_t kind) {
        if (kind == t_reduce || kind == t_round_end) {
          if (!me->round_ || epoch != me->round_epoch_)
            return;
          if (kind == t_reduce)
            me->round_->engine->reduce_deadline();
          else
            me->round_->engine->round_deadline();
          me->progress();
          return;
        }
        me->apply(me->mm_.on_timer(epoch, static_cast<mm_timer>(kind)));
      },
      [me](const messages::avg_join& j) -> caf::result<messages::avg_join_reply> {
        // A join whose envelope was refused (counted by the wire context) is answered with the
        // reason; the matchmaker never sees it.
        if (!j.wire_error.empty()) {
          messages::avg_join_reply r;
          r.reason = j.wire_error;
          return r;
        }
        auto ticket = me->next_ticket_++;
        // Before the promise: making it moves the sender out of the current message.
        auto sender = caf::actor_cast<caf::actor>(me->self_->current_sender());
        auto rp = me->self_->make_response_promise<messages::avg_join_reply>();
        me->tickets_.emplace(ticket, std::make_pair(caf::response_promise{rp}, sender));
        me->ticket_addresses_[ticket] = j.member.address;
        if (j.member.bandwidth == 0 && !j.member.address.empty() && j.member.address.size() <= 1024
            && sender) {
          // A client: never resolved; the handle it asked us from is how we reach it.
          me->clients_.insert(j.member.address);
          me->peers_[j.member.address] = sender;
        }
        me->apply(me->mm_.on_join(ticket, j));
        return rp;
      },
      [me](const messages::avg_leave& l) {
        // Refused envelopes (wire_error) are counted by the wire context; one-way, nothing to
        // answer, and their empty fields must not act on the round or the matchmaker.
        if (!l.wire_error.empty())
          return;
        if (me->round_ && me->cur_ && l.group_key == me->cur_->group_key && l.leader.empty()) {
          auto& r = *me->round_;
          for (uint32_t i = 0; i < r.members.size(); ++i)
            if (r.members[i].address == l.address && i != r.engine->self())
              r.engine->member_gone(i, "left the round");
          me->progress();
        }
        me->apply(me->mm_.on_leave(l)); // also drops a join waiting for our next request
      },
      [me](const messages::avg_group& g) {
        if (g.wire_error.empty())
          me->apply(me->mm_.on_group(g));
      },
      [me](avg_chunk& c) { me->on_chunk(c, me->self_->current_sender()); },
      [me](const avg_ack& a) {
        if (!a.wire_error.empty() || !me->round_ || a.group_id != me->round_->engine->id())
          return;
        me->round_->engine->on_ack(a.from, a.kind);
        me->progress();
      },
      [me](avg_plane_atom, const std::string& address, const std::string& transport_id)
          -> caf::result<std::string, std::string, uint16_t, std::string, uint32_t> {
        if (!me->transport_ || address.empty() || address.size() > 1024 || transport_id.empty()
            || transport_id.size() > 1024)
          return {std::string{}, std::string{}, uint16_t{0}, std::string{}, uint32_t{0}};
        // Chunks from `address` must come over a link to `transport_id` from now on.
        auto& info = me->remotes_[address];
        info.id = transport_id;
        if (me->round_)
          for (uint32_t i = 0; i < me->round_->members.size(); ++i)
            if (me->round_->members[i].address == address && me->client_member(i)) {
              // A client asking for our transport: it links to us, we answer over that link.
              me->adopt_client(i, caf::actor_cast<caf::actor>(me->self_->current_sender()));
              break;
            }
        return {me->transport_->id(), me->transport_->host(), me->transport_->port(),
                me->transport_->issue(transport_id), me->channel_};
      },
      [me](avg_plane_atom, uint64_t tag, const std::string& peer, avg_chunk& c) {
        if (me->transport_ && tag == me->tag_)
          me->on_plane_chunk(c, peer);
      },
      [me](avg_plane_atom, uint64_t tag, const std::string& peer, const std::string& why) {
        if (me->transport_ && tag == me->tag_)
          me->on_link_lost(peer, why);
      },
      [me](avg_plane_atom, uint64_t tag, const std::string& peer) {
        if (me->transport_ && tag == me->tag_)
          me->on_link_up(peer);
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
  auto s = std::make_shared<shell>(self, std::move(dht), std::move(resolver), std::move(opts));
  return s->make_behavior();
}

caf::actor spawn_averager(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                          averager_options opts) {
  return sys.spawn(averager_actor, std::move(dht), std::move(resolver), std::move(opts));
}

} // namespace starling::actors::averager
