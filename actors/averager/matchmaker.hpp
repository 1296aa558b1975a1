// The protocol core of averager matchmaking (no CAF, no clock): inputs are DHT records, peer
// messages and timer events; outputs are effects for the shell to carry out (announce, poll,
// send, answer, set a timer, start the round, give up). Tests drive many of them over a
// simulated DHT and network without actors.
//
// Protocol (why: peers see slightly different DHT views, so "everyone computes the same group
// from the DHT" does not converge; a leader that decides the membership and tells everyone does,
// and needs only that views eventually agree on who is smallest):
//   1. A peer announces itself under the DHT key `key_prefix + group_key` (subkey = its address,
//      value = bandwidth, auxiliary flag, vector size; expiration = now + 2 windows + grace) and
//      polls that key every `poll_interval` during the window.
//   2. Its leader is the smallest address it has seen with the same vector size, itself included,
//      that has not refused it. When it sees a smaller one than its current leader it sends
//      `avg_join` to it (and `avg_leave` to the old one; if it was leading, it sends `avg_leave`
//      naming the new leader to its followers, who follow it there). A leader only ever switches
//      to smaller addresses, so the choices converge on the smallest live peer. A peer that leads
//      after its first poll also sends `avg_join` to the peers that poll showed which would follow
//      it (larger addresses, clients): they announced before it started and may end their window
//      before their next poll shows it. A peer asked by a smaller one that may lead, under its
//      key while it matches, follows it at once (answering "following you"), as if a poll had
//      shown it.
//   3. A leader accepts joins from larger addresses while it leads and is not full, redirects
//      joiners to its own leader when it follows someone, and refuses otherwise. A refusal holds
//      until the refusing peer announces itself anew (a later expiration in its record). The
//      leader closes the group when it is full (`target_group_size`), when every member of the
//      previous group under this key is back (see 5), or at the end of the window, and sends
//      `avg_group` (members sorted by address, a group id) to every member.
//   4. A peer that leads nobody at the end of the window, or follows a leader that sends no group
//      within `join_grace` after it, gives up (no partner). A leader whose request ends while it
//      matches (its peer left: `finish`) hands its followers to the smallest of them that may
//      lead (`avg_leave` naming it), so that they form a group without it instead of each giving
//      up after the grace; a follower told so by a leader that names nobody leads itself.
//   5. Persistent groups: after a round, every member remembers the group under its key, or with
//      `family_groups` under the key's family (`group_family`: the key without its trailing
//      digits, so the rounds "p/grad/17" and "p/grad/18" of a collaboration are one family). Its
//      next request under the key (in the family) sends `avg_join` to the old leader at once (no
//      poll needed), and the old leader closes as soon as all old members are back (with
//      `family_groups`: under the new key, and its first poll of this request showed nobody else
//      announcing: a newcomer it saw is waited for, or the window ends as usual; a peer that asked
//      to join after the group closed is remembered with it, so that the next round waits for it
//      too). A join that reaches the old leader before its own next request (while it still runs
//      the round, or idles) waits there and is answered when that request starts; the joiner's own
//      timeout covers a leader that never asks again. When a member is missing the leader waits for
//      the window as usual and forms the group without it; when the old leader is gone its
//      followers find the next one in the DHT.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "messages/averager.hpp"

namespace starling::actors::averager {

using messages::avg_group;
using messages::avg_join;
using messages::avg_join_reply;
using messages::avg_leave;

/// Settings of a matchmaker (the averager's, see averager_options).
struct matchmaker_options {
  /// This averager's address (`host:port/name`); members are ordered by address.
  std::string address;
  /// Relative bandwidth; 0 = client mode.
  double bandwidth = 1.0;
  /// Auxiliary: reduces but contributes no data.
  bool auxiliary = false;
  /// Largest group.
  uint32_t target_group_size = 16;
  /// Prefix of the DHT key.
  std::string key_prefix = "avg.";
  std::chrono::nanoseconds matchmaking_window = std::chrono::seconds(2);
  std::chrono::nanoseconds poll_interval = std::chrono::milliseconds(250);
  std::chrono::nanoseconds join_grace = std::chrono::seconds(2);
  /// Remember groups across rounds (5. above).
  bool persistent_groups = true;
  /// Remember them per key family (`group_family`), so that rounds under numbered keys
  /// ("p/grad/17", "p/grad/18") re-form at once; with it, an early close also waits for a first
  /// poll and for every peer it showed announcing, late joiners are remembered with the group
  /// and a join for the round led last is answered `round_over_reason`. Off: groups are
  /// remembered per exact key.
  bool family_groups = false;
};

/// One announcement as a DHT poll returned it.
struct announcement {
  /// The announcing averager's address (the record's subkey).
  std::string address;
  /// The record's value (`encode_announcement`).
  std::vector<char> value;
  /// Absolute DHT expiration; a later one means the peer announced itself anew.
  int64_t expiration_ns = 0;
};

/// Announcement value: "v1 <bandwidth> <auxiliary> <numel>".
std::vector<char> encode_announcement(double bandwidth, bool auxiliary, int64_t numel);
/// Parses an untrusted announcement value; false when malformed.
bool decode_announcement(const std::vector<char>& v, double& bandwidth, bool& auxiliary,
                         int64_t& numel);

/// The family of a group key, under which persistent groups are remembered: the key without its
/// trailing decimal digits ("p/grad/17" -> "p/grad/", "s/stage1/step4" -> "s/stage1/step"); a
/// key that does not end in a digit is its own family. Only rounds of one key ever average
/// together: the family only says whom to ask first.
std::string group_family(const std::string& key);

/// A leader's refusal of a join for the round it ran last under that key: the joiner gives up at
/// once instead of looking for partners until its window ends (it was remembered with the group,
/// and the family's next round waits for it).
inline constexpr const char* round_over_reason = "the round under this key is over";

/// A leader's refusal of a join under the key of the last group it was in (the group formed
/// without the joiner). Under a numbered key (one round: "p/grad/17") and without family groups
/// the joiner gives up at once when it has nobody else (no follower): it was too late for that
/// round, and waiting out its window would start its next request as late again, round after
/// round (a newcomer locked out of every group of the others). Under a key that rounds reuse it
/// waits as before: the leader may match under it again.
inline constexpr const char* closed_reason = "group already closed";

/// Timers a matchmaker sets.
enum class mm_timer : uint8_t { poll, window_end, follow_deadline };

/// Effects: what the shell must do.
namespace mm {
/// Store our announcement under `key` for `ttl`.
struct announce {
  std::string key;
  std::vector<char> value;
  std::chrono::nanoseconds ttl;
};
/// Read every announcement under `key` and hand them to `on_records`.
struct poll {
  std::string key;
};
/// Request `join` from `to`; hand the answer to `on_join_reply` (or a failure to
/// `on_join_failed`), with `epoch`.
struct send_join {
  std::string to;
  avg_join join;
  uint64_t epoch = 0;
};
/// Send `leave` to `to` (no answer).
struct send_leave {
  std::string to;
  avg_leave leave;
};
/// Send `group` to `to` (no answer).
struct send_group {
  std::string to;
  avg_group group;
};
/// Answer the join that came with `ticket`.
struct answer_join {
  uint64_t ticket = 0;
  avg_join_reply reply;
};
/// Call `on_timer(epoch, kind)` after `delay`.
struct set_timer {
  uint64_t epoch = 0;
  mm_timer kind = mm_timer::poll;
  std::chrono::nanoseconds delay{0};
};
/// The group is formed: run the round with these members (sorted by address).
struct formed {
  uint64_t group_id = 0;
  std::vector<messages::member_info> members;
};
/// No group: the request ends with `no_partner` and this reason.
struct gave_up {
  std::string why;
};
} // namespace mm

using mm_effect =
    std::variant<mm::announce, mm::poll, mm::send_join, mm::send_leave, mm::send_group,
                 mm::answer_join, mm::set_timer, mm::formed, mm::gave_up>;

/// One averager's matchmaking, one request at a time.
class matchmaker {
public:
  explicit matchmaker(matchmaker_options opts);

  /// Starts matchmaking for `group_key` with a vector of `numel` elements; `now_ns` (any clock)
  /// and `seed` make the group id.
  std::vector<mm_effect> start(const std::string& group_key, int64_t numel, int64_t now_ns,
                               uint64_t seed = 0);
  /// The announcements under our key (a poll's answer).
  std::vector<mm_effect> on_records(const std::vector<announcement>& records);
  /// A join request; its answer is an `answer_join` effect with `ticket`, now or later.
  std::vector<mm_effect> on_join(uint64_t ticket, const avg_join& join);
  /// The answer of `leader` to our join sent in `epoch`.
  std::vector<mm_effect> on_join_reply(uint64_t epoch, const std::string& leader,
                                       const avg_join_reply& reply);
  /// Our join to `leader` in `epoch` failed (timeout, unresolvable, ...).
  std::vector<mm_effect> on_join_failed(uint64_t epoch, const std::string& leader,
                                        const std::string& why);
  std::vector<mm_effect> on_leave(const avg_leave& leave);
  std::vector<mm_effect> on_group(const avg_group& group);
  std::vector<mm_effect> on_timer(uint64_t epoch, mm_timer kind);
  /// The request ended (its round finished, it was cancelled, or it failed): leaves the leader
  /// we follow, or hands our followers on, while still matching. `members` is the group of a
  /// round that ran (empty otherwise): remembered for the next request under the same key when
  /// persistent.
  std::vector<mm_effect> finish(std::vector<messages::member_info> members = {});
  /// A member of the remembered group under `group_key` left or went down: forget the group.
  void forget(const std::string& group_key);

  /// True while matching (start .. formed / gave_up).
  bool matching() const { return phase_ == phase::matching; }
  /// The key being matched or run, empty when idle.
  const std::string& group_key() const { return key_; }
  /// The current epoch (timers and join replies of older ones are ignored).
  uint64_t epoch() const { return epoch_; }
  /// The leader we follow (empty: we lead).
  const std::string& leader() const { return leader_; }
  /// Followers of ours so far.
  const std::vector<messages::member_info>& followers() const { return followers_; }

private:
  enum class phase { idle, matching, formed };
  messages::member_info me() const;
  /// Client mode (bandwidth 0): leads no group, follows the smallest non-client address.
  bool client() const { return opts_.bandwidth == 0; }
  void switch_to(const std::string& leader, std::vector<mm_effect>& out);
  void refuse(const std::string& leader);
  avg_join_reply decide_join(const avg_join& j, std::vector<mm_effect>& out);
  void close_group(std::vector<mm_effect>& out);
  void give_up(std::string why, std::vector<mm_effect>& out);
  bool previous_group_back() const;
  void close_if_back(std::vector<mm_effect>& out);
  void note_late(const avg_join& j);
  void nudge(const std::vector<announcement>& records, std::vector<mm_effect>& out);
  std::string memory_key(const std::string& key) const;

  matchmaker_options opts_;
  phase phase_ = phase::idle;
  std::string key_;
  int64_t numel_ = 0;
  int64_t now_ns_ = 0;
  uint64_t seed_ = 0;
  uint64_t epoch_ = 0;
  std::string leader_;
  std::vector<messages::member_info> followers_;
  /// Leaders that refused us, with the expiration of their announcement when they did.
  std::map<std::string, int64_t> refused_;
  /// Leaders that told us they left or moved on in this matchmaking (their `avg_leave`).
  std::set<std::string> departed_;
  /// The latest announcement expiration seen per address in this matchmaking.
  std::map<std::string, int64_t> announced_;
  bool closed_ = false;
  bool window_over_ = false;
  /// A poll of this request was answered; the peers it showed announcing under our key (valid
  /// announcements of our vector size, clients and auxiliaries included).
  bool polled_ = false;
  std::set<std::string> seen_;
  /// Peers that asked to join after we closed our group (remembered with it, see decide_join).
  std::vector<messages::member_info> late_;
  /// The key of the last round whose group we led (late joins for it are remembered too).
  std::string last_led_;
  /// The key of the last group this peer was in (led or followed).
  std::string formed_key_;
  /// The group of this request once formed.
  std::vector<messages::member_info> members_;
  /// Remembered groups by key family (persistent groups).
  std::map<std::string, std::vector<messages::member_info>> previous_;
  /// Joins from remembered members that arrived before our request under their key (of the
  /// remembered group's family).
  struct waiting_join {
    uint64_t ticket;
    avg_join join;
  };
  std::vector<waiting_join> waiting_;
};

} // namespace starling::actors::averager
