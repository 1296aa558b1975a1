#include "runtime/observe/exposition.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/observe/snapshot.hpp"

namespace starling::runtime::observe {

namespace {

using label_list = std::vector<std::pair<std::string, std::string>>;

metric_family counter(std::string name, std::string help) {
  return {std::move(name), std::move(help), "counter", {}};
}

metric_family gauge(std::string name, std::string help) {
  return {std::move(name), std::move(help), "gauge", {}};
}

template <class Map>
void add_labelled(metric_family& f, const std::string& label, const Map& m) {
  for (auto& [k, v] : m)
    f.samples.push_back({{{label, k}}, static_cast<double>(v)});
}

std::string format_value(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

/// The length of the valid UTF-8 sequence at `s[i]`, or 0 when it is not one.
size_t utf8_length(const std::string& s, size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size())
    return 0;
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2)
      return 0;
    cp = (cp << 6) | (c & 0x3f);
  }
  static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD (peers name things).
std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto n = utf8_length(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    auto n = utf8_length(s, i);
    if (n == 0)
      return false;
    i += n;
  }
  return true;
}

std::string escape_label(const std::string& raw) {
  auto s = valid_utf8(raw);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& raw) {
  auto s = valid_utf8(raw);
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

bool is_metric_name(const std::string& s) {
  if (s.empty())
    return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
      return false;
  }
  return true;
}

bool is_label_name(const std::string& s) {
  return is_metric_name(s) && s.find(':') == std::string::npos && s.rfind("__", 0) != 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// A float as Go's ParseFloat reads it in this format: NaN, +Inf, -Inf, or a decimal.
bool parse_value(const std::string& s, double& out) {
  if (s == "NaN") {
    out = std::nan("");
    return true;
  }
  if (s == "+Inf" || s == "Inf") {
    out = INFINITY;
    return true;
  }
  if (s == "-Inf") {
    out = -INFINITY;
    return true;
  }
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    ++i;
  size_t digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9')
    ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      ++i, ++digits;
  }
  if (digits == 0)
    return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-'))
      ++i;
    size_t exp = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      ++i, ++exp;
    if (exp == 0)
      return false;
  }
  if (i != s.size())
    return false;
  out = std::strtod(s.c_str(), nullptr);
  return true;
}

bool is_integer(const std::string& s) {
  size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  if (i == s.size())
    return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9')
      return false;
  return true;
}

/// The family a sample name belongs to (histogram and summary series carry suffixes).
std::string family_of(const std::string& sample, const std::map<std::string, std::string>& types) {
  if (types.count(sample))
    return sample;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (ends_with(sample, suffix)) {
      auto base = sample.substr(0, sample.size() - std::string{suffix}.size());
      auto t = types.find(base);
      if (t != types.end() && (t->second == "histogram" || t->second == "summary"))
        return base;
    }
  }
  return sample;
}

} // namespace

std::vector<metric_family> families_of(const snapshot& s) {
  std::vector<metric_family> out;
  auto g = [&](const char* name, const char* help, double v) {
    out.push_back(gauge(name, help));
    out.back().samples.push_back({{}, v});
  };
  // A family with one label: one sample per key of `m`.
  auto labelled = [&](metric_family f, const char* label, const auto& m) {
    add_labelled(f, label, m);
    out.push_back(std::move(f));
  };
  auto c = [&](const char* name, const char* help, double v) {
    out.push_back(counter(name, help));
    out.back().samples.push_back({{}, v});
  };
  out.push_back(
      gauge("starling_run_info", "The watched run (value 1): experiment, kind, mode, seed"));
  out.back().samples.push_back({{{"experiment", s.run.experiment},
                                 {"kind", s.run.kind},
                                 {"mode", s.run.mode},
                                 {"seed", std::to_string(s.run.seed)}},
                                1});
  g("starling_snapshot_version", "Version of the snapshot this answer was rendered from",
    static_cast<double>(s.version));
  g("starling_run_nodes", "Nodes of the run", static_cast<double>(s.run.nodes));
  g("starling_run_start_time_seconds", "Wall-clock start of the run, seconds since the Unix epoch",
    s.run.start_unix_s);
  g("starling_run_time_seconds", "Run time of the latest event, seconds", s.run_time_s);
  g("starling_run_finished", "1 once the run ended", s.finished ? 1 : 0);
  c("starling_events_total", "Metric events received from every node",
    static_cast<double>(s.events_total));
  labelled(counter("starling_events_by_kind_total",
                   "Metric events by kind (bounded; the rest under kind=\"other\")"),
           "kind", s.events_by_kind);
  c("starling_samples_total", "Samples processed by every trainer and peer", s.samples_total);
  c("starling_samples_accepted_total",
    "Samples accepted: what round partners (SWARM: stage-0 peers) credited the peers with",
    s.samples_accepted_total);
  c("starling_microbatches_total", "Microbatches completed by trainers",
    static_cast<double>(s.microbatches_total));
  labelled(counter("starling_averaging_rounds_total",
                   "Averaging rounds by outcome (averaged with partners, or alone)"),
           "outcome", s.rounds_by_outcome);
  c("starling_retries_total", "Microbatch retries", static_cast<double>(s.retries_total));
  c("starling_restarts_total", "Restarts of instances and nodes",
    static_cast<double>(s.restarts_total));
  labelled(counter("starling_faults_total",
                   "Faults by action (kill_instance: preemptions; kill_node; ...)"),
           "action", s.faults_by_action);
  c("starling_joins_total", "Peers that joined", static_cast<double>(s.joins_total));
  c("starling_leaves_total", "Peers that left", static_cast<double>(s.leaves_total));
  c("starling_dropped_samples_total", "Samples computed but not averaged", s.dropped_samples_total);
  labelled(counter("starling_refusals_total",
                   "Refused envelopes by reason (bounded; the rest under reason=\"other\")"),
           "reason", s.refusals_by_reason);
  labelled(counter("starling_peer_samples_total",
                   "Samples per peer: the first 20 peers that reported work, the rest under "
                   "peer=\"other\""),
           "peer", s.peer_samples_total);
  labelled(counter("starling_stage_samples_total",
                   "Samples whose backward each SWARM stage's peers applied (their ledger "
                   "summaries; bounded)"),
           "stage", s.stage_samples_total);
  labelled(counter("starling_peer_sent_bytes_total",
                   "Bytes each peer sent averaging (the ledger's first 20 peers, the rest "
                   "under peer=\"other\")"),
           "peer", s.peer_bytes_sent_total);
  labelled(counter("starling_peer_received_bytes_total",
                   "Bytes each peer received averaging (the peers of "
                   "starling_peer_sent_bytes_total)"),
           "peer", s.peer_bytes_received_total);
  c("starling_bans_total", "Peers the run banned (verdicts, the gates' bans and revocations)",
    static_cast<double>(s.bans_total));
  g("starling_samples_per_second", "Samples per second over the last 10 s of run time",
    s.samples_per_second);
  labelled(gauge("starling_peer_samples_per_second",
                 "Samples per second per peer over the last 10 s of run time (the peers of "
                 "starling_peer_samples_total)"),
           "peer", s.peer_samples_per_second);
  labelled(gauge("starling_stage_samples_per_second",
                 "Samples per second each SWARM stage applied over the last 30 s of run "
                 "time"),
           "stage", s.stage_samples_per_second);
  g("starling_loss", "Latest training loss (NaN before the first)", s.loss);
  g("starling_global_step", "Highest global step reached (-1: none yet)", s.global_step);
  labelled(gauge("starling_live_instances", "Live role instances by role"), "role", s.live_by_role);
  labelled(gauge("starling_live_peers_by_mode",
                 "Live data-parallel peers by mode (full: reachable; client: dials out "
                 "only)"),
           "mode", s.live_by_mode);
  return out;
}

std::string render_exposition(const std::vector<metric_family>& families) {
  std::string out;
  for (auto& f : families) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, escape_help(f.help), f.name, f.type);
    for (auto& s : f.samples) {
      out += f.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i)
          out += fmt::format("{}{}=\"{}\"", i ? "," : "", s.labels[i].first,
                             escape_label(s.labels[i].second));
        out += '}';
      }
      out += ' ';
      out += format_value(s.value);
      out += '\n';
    }
  }
  return out;
}

std::string render_metrics(const snapshot& s) {
  return render_exposition(families_of(s));
}

result<std::vector<metric_family>> parse_exposition(const std::string& text) {
  if (text.empty())
    return fail("empty exposition: expected at least one family");
  if (text.back() != '\n')
    return fail("the exposition does not end with a newline");
  if (!is_utf8(text))
    return fail("the exposition is not valid UTF-8");
  std::vector<metric_family> out;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::set<std::string> closed; // families whose samples ended (another family's came)
  std::set<std::string> series;
  std::string current; // family of the latest sample
  size_t lineno = 0;
  size_t pos = 0;
  auto family_index = [&](const std::string& name) -> metric_family& {
    for (auto& f : out)
      if (f.name == name)
        return f;
    out.push_back({name, "", "", {}});
    return out.back();
  };
  while (pos < text.size()) {
    auto end = text.find('\n', pos);
    auto line = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineno;
    auto bad = [&](const std::string& why) {
      return fail(fmt::format("line {}: {}: \"{}\"", lineno, why, line.substr(0, 120)));
    };
    if (line.empty())
      continue;
    if (line[0] == '#') {
      // `# HELP name text`, `# TYPE name type`, or a comment.
      size_t i = 1;
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t'))
        ++i;
      auto word_end = line.find_first_of(" \t", i);
      auto word = line.substr(i, word_end == std::string::npos ? std::string::npos : word_end - i);
      if (word != "HELP" && word != "TYPE")
        continue;
      if (word_end == std::string::npos)
        return bad("expected a metric name after " + word);
      i = word_end;
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t'))
        ++i;
      auto name_end = line.find_first_of(" \t", i);
      auto name = line.substr(i, name_end == std::string::npos ? std::string::npos : name_end - i);
      if (!is_metric_name(name))
        return bad("expected a metric name after " + word);
      std::string rest;
      if (name_end != std::string::npos) {
        rest = line.substr(name_end);
        auto k = rest.find_first_not_of(" \t");
        rest = k == std::string::npos ? "" : rest.substr(k);
      }
      auto& fam = family_index(name);
      if (!fam.samples.empty() || closed.count(name))
        return bad(word + " of " + name + " after its samples");
      if (word == "HELP") {
        if (!helped.insert(name).second)
          return bad("a second HELP for " + name);
        std::string help;
        for (size_t k = 0; k < rest.size(); ++k) {
          if (rest[k] == '\\') {
            if (k + 1 < rest.size() && rest[k + 1] == '\\')
              help += '\\';
            else if (k + 1 < rest.size() && rest[k + 1] == 'n')
              help += '\n';
            else
              return bad("expected \\\\ or \\n in HELP text");
            ++k;
          } else {
            help += rest[k];
          }
        }
        fam.help = help;
      } else {
        if (types.count(name))
          return bad("a second TYPE for " + name);
        static const std::set<std::string> known{"counter", "gauge", "histogram", "summary",
                                                 "untyped"};
        if (!known.count(rest))
          return bad("expected a type of counter, gauge, histogram, summary or untyped");
        if (rest == "counter" && !ends_with(name, "_total"))
          return bad("a counter named without the _total suffix: " + name);
        types[name] = rest;
        fam.type = rest;
      }
      continue;
    }
    // A sample: name, optional {labels}, value, optional timestamp.
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ' && line[i] != '\t')
      ++i;
    auto name = line.substr(0, i);
    if (!is_metric_name(name))
      return bad("expected a metric name");
    label_list labels;
    std::set<std::string> label_names;
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        auto eq = line.find('=', i);
        if (eq == std::string::npos)
          return bad("expected label=\"value\"");
        auto lname = line.substr(i, eq - i);
        if (!is_label_name(lname))
          return bad("expected a label name, got \"" + lname + "\"");
        if (!label_names.insert(lname).second)
          return bad("label " + lname + " twice");
        i = eq + 1;
        if (i >= line.size() || line[i] != '"')
          return bad("expected a quoted label value");
        ++i;
        std::string value;
        bool closed_quote = false;
        while (i < line.size()) {
          char ch = line[i++];
          if (ch == '"') {
            closed_quote = true;
            break;
          }
          if (ch == '\\') {
            if (i >= line.size())
              return bad("a label value ends in a backslash");
            char e = line[i++];
            if (e == '\\')
              value += '\\';
            else if (e == '"')
              value += '"';
            else if (e == 'n')
              value += '\n';
            else
              return bad("expected \\\\, \\\" or \\n in a label value");
          } else {
            value += ch;
          }
        }
        if (!closed_quote)
          return bad("an unterminated label value");
        labels.emplace_back(lname, value);
        if (i < line.size() && line[i] == ',') {
          ++i;
          continue;
        }
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        return bad("expected , or } after a label");
      }
    }
    if (i >= line.size() || (line[i] != ' ' && line[i] != '\t'))
      return bad("expected a blank and a value after the series");
    auto rest = line.substr(i);
    std::vector<std::string> words;
    size_t k = 0;
    while (k < rest.size()) {
      while (k < rest.size() && (rest[k] == ' ' || rest[k] == '\t'))
        ++k;
      if (k >= rest.size())
        break;
      auto e = rest.find_first_of(" \t", k);
      words.push_back(rest.substr(k, e == std::string::npos ? std::string::npos : e - k));
      k = e == std::string::npos ? rest.size() : e;
    }
    if (words.empty() || words.size() > 2)
      return bad("expected a value and an optional timestamp");
    double v = 0;
    if (!parse_value(words[0], v))
      return bad("expected a float value (NaN, +Inf, -Inf or a decimal), got \"" + words[0] + "\"");
    if (words.size() == 2 && !is_integer(words[1]))
      return bad("expected an integer timestamp in milliseconds");
    auto fam_name = family_of(name, types);
    if (!types.count(fam_name) || !helped.count(fam_name))
      return bad("a sample of " + fam_name + " before its HELP and TYPE");
    if (closed.count(fam_name))
      return bad("samples of " + fam_name + " are not together");
    if (!current.empty() && current != fam_name)
      closed.insert(current);
    current = fam_name;
    auto key = name;
    {
      auto sorted = labels;
      std::sort(sorted.begin(), sorted.end());
      for (auto& [a, b] : sorted)
        key += "\x1f" + a + "=" + b;
    }
    if (!series.insert(key).second)
      return bad("the series " + name + " twice");
    if (types[fam_name] == "counter" && !(v >= 0))
      return bad("a counter with a negative or NaN value");
    family_index(fam_name).samples.push_back({std::move(labels), v});
  }
  for (auto& f : out)
    if (f.type.empty() || !helped.count(f.name))
      return fail(fmt::format("family {} lacks its {}", f.name, f.type.empty() ? "TYPE" : "HELP"));
  return out;
}

status check_counters_grow(const std::vector<metric_family>& before,
                           const std::vector<metric_family>& after) {
  for (auto& f : before) {
    if (f.type != "counter")
      continue;
    for (auto& s : f.samples) {
      auto v = find_sample(after, f.name, s.labels);
      if (std::isnan(v))
        return fail(fmt::format("counter {} lost a series", f.name));
      if (v < s.value)
        return fail(fmt::format("counter {} went down from {} to {}", f.name, s.value, v));
    }
  }
  return {};
}

double find_sample(const std::vector<metric_family>& families, const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& labels) {
  auto sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (auto& f : families) {
    if (f.name != name)
      continue;
    for (auto& s : f.samples) {
      auto l = s.labels;
      std::sort(l.begin(), l.end());
      if (l == sorted)
        return s.value;
    }
  }
  return std::nan("");
}

} // namespace starling::runtime::observe
