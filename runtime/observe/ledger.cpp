#include "runtime/observe/ledger.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "actors/collab/ledger_record.hpp"
#include "actors/dht/signing.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::runtime::observe {

namespace {

namespace collab = starling::actors::collab;

double event_value(const event_view& e, const char* key) {
  auto i = e.values.find(key);
  return i == e.values.end() || !std::isfinite(i->second) ? 0.0 : i->second;
}

const std::string& event_label(const event_view& e, const char* key) {
  static const std::string none;
  auto i = e.labels.find(key);
  return i == e.labels.end() ? none : i->second;
}

/// A count from an event: finite and > 0, else 0.
double positive_count(double v) {
  return std::isfinite(v) && v > 0 ? v : 0.0;
}

/// The first 16 hex digits of the owner key in a record id, or the id's address part.
std::string peer_id_of(const std::string& id) {
  if (auto key = actors::dht::owner_of(id); key && !key->empty()) {
    static const char* digits = "0123456789abcdef";
    std::string hex;
    for (size_t i = 0; i < key->size() && hex.size() < 16; ++i) {
      auto c = static_cast<unsigned char>((*key)[i]);
      hex.push_back(digits[c >> 4]);
      hex.push_back(digits[c & 15]);
    }
    return hex;
  }
  return id.substr(0, id.find('|'));
}

/// A CSV field: quoted when it holds a comma, quote or line break (RFC 4180).
std::string ledger_csv_field(const std::string& text) {
  // A name a peer chose must not become a formula in a spreadsheet: a leading = + - @ is quoted.
  auto s = !text.empty() && std::string_view{"=+-@"}.find(text[0]) != std::string_view::npos
               ? "'" + text
               : text;
  if (s.find_first_of(",\"\r\n") == std::string::npos)
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"')
      out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

/// A credit name made by `collab::trainer_credit_name` (`mb:` and 6 hex digits).
bool is_trainer_tag(const std::string& name) {
  if (name.size() != 9 || name.compare(0, 3, "mb:") != 0)
    return false;
  return std::all_of(name.begin() + 3, name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string ledger_csv_number(double v) {
  if (!std::isfinite(v))
    return "";
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return fmt::format("{:.0f}", v);
  return fmt::format("{:.3f}", v);
}

} // namespace

ledger_row::ledger_row() : loss(std::nan("")) {
  // nop
}

ledger_book::ledger_book(ledger_options opts) : opts_(opts) {
  opts_.max_rows = std::max<size_t>(opts_.max_rows, 1);
}

std::string ledger_book::slot(const std::string& name) {
  if (names_.count(name) > 0)
    return name;
  // `other` is one of the `max_rows` rows.
  if (names_.size() + 1 < opts_.max_rows && name != "other" && !name.empty()) {
    names_.emplace(name, true);
    return name;
  }
  names_.emplace("other", true);
  return "other";
}

void ledger_book::add(const event_view& e) {
  auto& k = e.kind;
  bool peer_event = k == "dp_step" || k == "dp_dropped" || k == "dp_credit" || k == "dp_join" ||
                    k == "dp_leave" || k == "microbatch";
  if (peer_event) {
    if (e.source.empty())
      return;
    auto& s = stream_[slot(e.source)];
    auto& c = s.total;
    if (k == "dp_join") {
      // A new incarnation: the byte counters and the uptime start again.
      s.total.bytes_sent += s.bytes_sent_now;
      s.total.bytes_received += s.bytes_received_now;
      s.bytes_sent_now = s.bytes_received_now = 0;
      if (c.first_s >= 0)
        s.uptime_before += std::max(0.0, c.last_s - c.first_s);
      c.first_s = c.last_s = -1;
      c.left = false;
    }
    if (std::isfinite(e.t)) {
      if (c.first_s < 0)
        c.first_s = e.t;
      c.last_s = std::max(c.last_s, e.t);
    }
    if (k == "dp_step") {
      c.computed += positive_count(event_value(e, "samples"));
      c.rounds += 1;
      if (event_value(e, "averaged") > 0)
        c.rounds_averaged += 1;
      s.bytes_sent_now = std::max(s.bytes_sent_now, positive_count(event_value(e, "bytes_sent")));
      s.bytes_received_now =
          std::max(s.bytes_received_now, positive_count(event_value(e, "bytes_received")));
    } else if (k == "microbatch") {
      c.computed += positive_count(event_value(e, "samples"));
    } else if (k == "dp_dropped") {
      auto n = positive_count(event_value(e, "samples"));
      c.computed += n;
      c.dropped += n;
    } else if (k == "dp_leave") {
      c.left = true;
    } else if (k == "dp_credit") {
      for (auto& [partner, v] : e.values)
        if (positive_count(v) > 0 && partner.size() <= collab::max_ledger_name_bytes)
          c.credits[slot(partner)] += v;
    }
    return;
  }
  if (k == "refused" || k == "ban") {
    auto& peer = event_label(e, "peer");
    if (peer.empty())
      return;
    if (k == "refused")
      refuse(peer);
    else
      ban(peer, event_label(e, "reason"));
  }
}

void ledger_book::ban(const std::string& peer, const std::string& reason) {
  if (peer.empty())
    return;
  auto& s = stream_[slot(peer)];
  s.banned = true;
  s.ban_reason = reason.substr(0, 200);
}

void ledger_book::refuse(const std::string& peer) {
  if (!peer.empty())
    stream_[slot(peer)].refusals++;
}

void ledger_book::set_trainers(const std::vector<std::string>& trainers) {
  trainer_tags_.clear();
  for (auto& [name, tag] : collab::trainer_tags(trainers))
    trainer_tags_[collab::trainer_credit_name_of_tag(tag)] = name;
}

void ledger_book::merge_gate_party(gate_held& g, const gate_refused_peer& p, size_t bound) {
  if (p.peer_id.empty() || p.peer_id.size() > collab::max_ledger_token_id_bytes)
    return;
  auto i = g.parties.find(p.peer_id);
  if (i == g.parties.end()) {
    if (g.parties.size() >= bound)
      return;
    i = g.parties.emplace(p.peer_id, gate_refused_peer{p.peer_id, 0, {}}).first;
  }
  // Counters never go back, even when the gate moved the party to its `other`.
  i->second.refusals = std::max(i->second.refusals, p.refusals);
  if (!p.ban_reason.empty())
    i->second.ban_reason = p.ban_reason.substr(0, 300);
}

void ledger_book::set_gate_refusals(const std::vector<gate_refused_peer>& peers) {
  auto& g = gates_[own_gate_id_];
  for (auto& p : peers)
    merge_gate_party(g, p, opts_.max_rows);
}

void ledger_book::set_own_gate_id(const std::string& id) {
  if (id == own_gate_id_)
    return;
  // What the gate said before it had a name is its own.
  if (auto i = gates_.find(own_gate_id_); i != gates_.end()) {
    auto held = std::move(i->second);
    gates_.erase(i);
    auto& g = gates_[id];
    for (auto& [pid, p] : held.parties)
      merge_gate_party(g, p, opts_.max_rows);
  }
  own_gate_id_ = id;
}

ledger_read_stats ledger_book::add_records(const std::vector<ledger_entry>& entries, double now) {
  ledger_read_stats st;
  advance(now);
  size_t decoded = 0;
  for (auto& e : entries) {
    if (decoded >= collab::max_ledger_reply_records) {
      st.rejected++;
      continue;
    }
    ++decoded;
    if (e.gate) {
      auto g = collab::decode_gate_record(e.subkey, e.value);
      if (!g) {
        st.rejected++;
        continue;
      }
      auto it = gates_.find(g->id);
      if (it == gates_.end() && gates_.size() > collab::max_ledger_reply_records) {
        st.rejected++; // a flood of gates: keep what is held
        continue;
      }
      auto& held = gates_[g->id];
      held.time = std::max(held.time, g->time);
      for (auto& p : g->parties)
        merge_gate_party(held,
                         gate_refused_peer{p.peer_id, static_cast<uint64_t>(p.refusals),
                                           p.ban_reason},
                         collab::max_gate_parties);
      st.accepted++;
      continue;
    }
    auto s = collab::decode_summary_record(e.subkey, e.value);
    if (!s) {
      st.rejected++;
      continue;
    }
    auto key = std::make_pair(s->id, s->started);
    auto it = records_.find(key);
    if (it != records_.end() && it->second.time >= s->time)
      continue; // an older copy from another replica
    held h;
    h.name = slot(s->name);
    h.peer_id = peer_id_of(s->id);
    h.token_id = s->token_id;
    h.time = s->time;
    h.expires_at = std::isfinite(e.expires_at) ? e.expires_at : 0;
    h.c.computed = s->computed;
    h.c.dropped = s->dropped;
    h.c.rounds = s->rounds;
    h.c.rounds_averaged = s->rounds_averaged;
    h.c.bytes_sent = s->bytes_sent;
    h.c.bytes_received = s->bytes_received;
    h.c.first_s = s->started;
    h.c.last_s = std::max(s->started, s->time);
    h.c.left = s->left;
    h.c.stage = s->stage;
    h.c.has_loss = std::isfinite(s->loss);
    h.c.loss = h.c.has_loss ? s->loss : 0;
    h.c.step = s->step;
    // A stage's credit to a trainer's tag is no row of its own: `rows` finds its trainer.
    for (auto& cr : s->credits)
      h.c.credits[is_trainer_tag(cr.peer) ? cr.peer : slot(cr.peer)] += cr.samples;
    if (it == records_.end() && records_.size() >= 16 * opts_.max_rows) {
      st.rejected++; // a flood of incarnations: keep what is held
      continue;
    }
    records_[key] = std::move(h);
    st.accepted++;
  }
  return st;
}

void ledger_book::advance(double now) {
  if (std::isfinite(now) && now > now_)
    now_ = now;
}

std::vector<ledger_row> ledger_book::rows() const {
  // Per name: the stream's counts and the records' sums, then the larger of the two.
  struct merged {
    counts rec;
    double rec_uptime = 0;
    bool has_record = false, live = false, rec_left = false;
    double latest = -1;
    std::string peer_id;
    int stage = -1;
    double loss = std::nan(""), step = -1;
    std::string token_id;
  };
  std::map<std::string, merged> by_name;
  for (auto& [key, h] : records_) {
    auto& m = by_name[h.name];
    m.has_record = true;
    m.live = m.live || now_ < h.expires_at;
    if (h.time >= m.latest) {
      m.latest = h.time;
      m.rec_left = h.c.left;
      m.peer_id = h.peer_id;
      m.stage = h.c.stage;
      m.token_id = h.token_id;
      m.loss = h.c.has_loss ? h.c.loss : std::nan("");
      m.step = h.c.step;
    }
    m.rec.computed += h.c.computed;
    m.rec.dropped += h.c.dropped;
    m.rec.rounds += h.c.rounds;
    m.rec.rounds_averaged += h.c.rounds_averaged;
    m.rec.bytes_sent += h.c.bytes_sent;
    m.rec.bytes_received += h.c.bytes_received;
    m.rec_uptime += std::max(0.0, h.c.last_s - h.c.first_s);
    for (auto& [p, v] : h.c.credits)
      m.rec.credits[p] += v;
  }
  std::map<std::string, ledger_row> rows;
  for (auto& [name, on] : names_)
    rows[name].peer = name;
  // Credits per (creditor, partner): the larger of what the two sources say.
  std::map<std::string, std::map<std::string, double>> credits;
  for (auto& [name, s] : stream_)
    for (auto& [p, v] : s.total.credits)
      credits[name][p] = std::max(credits[name][p], v);
  for (auto& [name, m] : by_name)
    for (auto& [p, v] : m.rec.credits)
      credits[name][p] = std::max(credits[name][p], v);
  for (auto& [name, row] : rows) {
    const streamed* s = nullptr;
    if (auto i = stream_.find(name); i != stream_.end())
      s = &i->second;
    const merged* m = nullptr;
    if (auto i = by_name.find(name); i != by_name.end())
      m = &i->second;
    if (s) {
      auto& c = s->total;
      row.computed = c.computed;
      row.dropped = c.dropped;
      row.rounds = c.rounds;
      row.rounds_averaged = c.rounds_averaged;
      row.bytes_sent = c.bytes_sent + s->bytes_sent_now;
      row.bytes_received = c.bytes_received + s->bytes_received_now;
      row.uptime_s = s->uptime_before + (c.first_s >= 0 ? std::max(0.0, c.last_s - c.first_s) : 0);
      row.left = c.left;
      row.refusals = s->refusals;
      row.banned = s->banned;
      row.ban_reason = s->ban_reason;
    }
    if (m) {
      row.computed = std::max(row.computed, m->rec.computed);
      row.dropped = std::max(row.dropped, m->rec.dropped);
      row.rounds = std::max(row.rounds, m->rec.rounds);
      row.rounds_averaged = std::max(row.rounds_averaged, m->rec.rounds_averaged);
      row.bytes_sent = std::max(row.bytes_sent, m->rec.bytes_sent);
      row.bytes_received = std::max(row.bytes_received, m->rec.bytes_received);
      row.uptime_s = std::max(row.uptime_s, m->rec_uptime);
      row.left = row.left || m->rec_left;
      row.peer_id = m->peer_id;
      row.record = m->live ? "live" : "expired";
      row.stage = m->stage;
      row.loss = m->loss;
      row.step = m->step;
      row.token_id = m->token_id;
    }
  }
  // Trainers' tags -> their rows: the plan's trainers' distinct tags when known, else every
  // row's name's tag (a tag two names share credits neither: 24 bits collide once in about 16
  // million pairs).
  std::map<std::string, std::string> tags = trainer_tags_;
  if (tags.empty())
    for (auto& [name, row] : rows) {
      if (name == "other")
        continue;
      auto tag = collab::trainer_credit_name_of(name);
      auto [it, fresh] = tags.emplace(tag, name);
      if (!fresh)
        it->second.clear();
    }
  for (auto& [creditor, given] : credits)
    for (auto& [partner, v] : given) {
      auto target = partner;
      if (is_trainer_tag(partner)) {
        auto t = tags.find(partner);
        if (t == tags.end() || t->second.empty())
          continue;
        target = t->second;
      }
      if (target != creditor)
        if (auto r = rows.find(target); r != rows.end())
          r->second.accepted += v;
    }
  // The gates' refusals, summed over the run's gates: on every row of the party's key, or on a
  // row of its own.
  struct refused_party {
    std::string peer_id;
    uint64_t refusals = 0;
    uint64_t refused_by_gates = 0;
    std::string ban_reason;
  };
  std::map<std::string, refused_party> refused;
  for (auto& [gid, held] : gates_)
    for (auto& [id, p] : held.parties) {
      auto& r = refused[id];
      r.peer_id = id;
      r.refusals += p.refusals;
      r.refused_by_gates += p.refusals > 0 ? 1 : 0;
      if (!p.ban_reason.empty())
        r.ban_reason = p.ban_reason;
    }
  for (auto& [id, g] : refused) {
    bool found = false;
    for (auto& [name, row] : rows)
      if (name != "other" && row.peer_id == id) {
        found = true;
        row.refusals += g.refusals;
        row.refused_by = std::max(row.refused_by, g.refused_by_gates);
        if (!g.ban_reason.empty()) {
          row.banned = true;
          row.ban_reason = g.ban_reason;
        }
      }
    if (found)
      continue;
    auto name = "peer:" + id;
    auto& row = rows[name];
    row.peer = name;
    row.peer_id = id;
    row.refusals = g.refusals;
    row.refused_by = g.refused_by_gates;
    row.banned = !g.ban_reason.empty();
    row.ban_reason = g.ban_reason;
  }
  std::vector<ledger_row> out;
  out.reserve(rows.size());
  for (auto& [name, row] : rows)
    if (name != "other")
      out.push_back(std::move(row));
  if (auto o = rows.find("other"); o != rows.end())
    out.push_back(std::move(o->second));
  return out;
}

std::string render_ledger_csv(const std::vector<ledger_row>& rows) {
  std::string out = "peer,peer_id,samples_computed,samples_accepted,samples_dropped,rounds,"
                    "rounds_averaged,uptime_s,bytes_sent,bytes_received,refusals,banned,"
                    "ban_reason,left,record,stage,token_id,refused_by\n";
  for (auto& r : rows) {
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                       ledger_csv_field(r.peer),
                       ledger_csv_field(r.peer_id), ledger_csv_number(r.computed),
                       ledger_csv_number(r.accepted), ledger_csv_number(r.dropped),
                       ledger_csv_number(r.rounds), ledger_csv_number(r.rounds_averaged),
                       ledger_csv_number(r.uptime_s), ledger_csv_number(r.bytes_sent),
                       ledger_csv_number(r.bytes_received), r.refusals, r.banned ? 1 : 0,
                       ledger_csv_field(r.ban_reason), r.left ? 1 : 0, r.record,
                       r.stage >= 0 ? std::to_string(r.stage) : std::string{},
                       ledger_csv_field(r.token_id), r.refused_by);
  }
  return out;
}

} // namespace starling::runtime::observe
