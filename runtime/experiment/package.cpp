#include "runtime/experiment/package.hpp"

#include <sodium.h>

#include <cstring>
#include <map>

#include "actors/auth/identity.hpp"

namespace starling::runtime {

namespace {

constexpr char magic[] = "starling-experiment-package-v1\n";
constexpr size_t magic_bytes = sizeof(magic) - 1;
constexpr std::string_view digest_tag = "starling-experiment-digest-v1";
constexpr std::string_view signature_tag = "starling-experiment-signature-v2";
/// The first format, which signed the digest alone (no node count).
constexpr std::string_view signature_tag_v1 = "starling-experiment-signature-v1";
constexpr size_t max_set_bytes = 4096;
constexpr size_t max_key_bytes = 256;
constexpr size_t max_path_bytes = 4096;
constexpr size_t max_endpoint_bytes = 300;
constexpr size_t max_detail_bytes = 1024;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_str(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s.data(), s.size());
}

/// A cursor over untrusted bytes; every read says whether it fit.
struct reader {
  std::string_view in;
  size_t pos = 0;

  bool u64(uint64_t& v) {
    if (in.size() - pos < 8)
      return false;
    v = 0;
    for (int i = 0; i < 8; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
    pos += 8;
    return true;
  }

  bool str(std::string& s, size_t max) {
    uint64_t n = 0;
    if (!u64(n) || n > max || n > in.size() - pos)
      return false;
    s.assign(in.data() + pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return true;
  }
};

failure bad(const std::string& what) {
  return fail("the experiment package is malformed: " + what);
}

} // namespace

std::string blake2b_256(std::string_view bytes) {
  unsigned char out[experiment_digest_bytes];
  crypto_generichash(out, sizeof(out), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  return std::string(reinterpret_cast<char*>(out), sizeof(out));
}

std::string experiment_digest(std::string_view yaml, const std::vector<std::string>& sets,
                              const std::vector<named_file>& files) {
  std::string m;
  put_str(m, digest_tag);
  put_str(m, yaml);
  put_u64(m, sets.size());
  for (auto& s : sets)
    put_str(m, s);
  put_u64(m, files.size());
  for (auto& f : files) {
    put_str(m, f.key);
    put_u64(m, f.size);
    put_str(m, f.digest);
  }
  return blake2b_256(m);
}

result<std::string> encode_package(const experiment_package& p) {
  if (p.yaml.size() > max_experiment_bytes)
    return fail("the experiment file is larger than 1 MiB");
  if (p.sets.size() > max_package_sets || p.files.size() > max_named_files)
    return fail("the experiment has more than 64 overrides or named files");
  for (auto& s : p.sets)
    if (s.size() > max_set_bytes)
      return fail("an override is longer than 4096 bytes");
  for (auto& f : p.files)
    if (f.key.size() > max_key_bytes || f.path.size() > max_path_bytes ||
        f.digest.size() != experiment_digest_bytes || f.size > max_served_file_bytes)
      return fail("named file " + f.key +
                  " is out of range (key, path, digest or size over 64 MiB)");
  if (p.digest.size() != experiment_digest_bytes)
    return fail("the experiment digest must be 32 bytes");
  if (!p.signature.empty() && p.signature.size() != 64)
    return fail("a signature is 64 bytes");
  if (p.endpoint.size() > max_endpoint_bytes || p.reach_detail.size() > max_detail_bytes)
    return fail("the endpoint or its verdict is too long");
  std::string out(magic, magic_bytes);
  put_u64(out, p.nodes);
  put_str(out, p.yaml);
  put_u64(out, p.sets.size());
  for (auto& s : p.sets)
    put_str(out, s);
  put_u64(out, p.files.size());
  for (auto& f : p.files) {
    put_str(out, f.key);
    put_str(out, f.path);
    put_str(out, f.digest);
    put_u64(out, f.size);
  }
  put_str(out, p.digest);
  put_str(out, p.signature);
  out.push_back(p.reachable ? 1 : 0);
  put_str(out, p.endpoint);
  put_str(out, p.reach_detail);
  return out;
}

result<experiment_package> decode_package(std::string_view bytes) {
  if (bytes.size() < magic_bytes || std::memcmp(bytes.data(), magic, magic_bytes) != 0)
    return bad("it does not start with its format line (another program, or another version)");
  reader r{bytes, magic_bytes};
  experiment_package p;
  uint64_t n = 0;
  if (!r.u64(p.nodes) || p.nodes == 0 || p.nodes > max_package_nodes)
    return bad("the node count is missing or not in [1, 100000]");
  if (!r.str(p.yaml, max_experiment_bytes))
    return bad("the experiment file is missing or larger than 1 MiB");
  if (!r.u64(n) || n > max_package_sets)
    return bad("more than 64 overrides");
  p.sets.resize(static_cast<size_t>(n));
  for (auto& s : p.sets)
    if (!r.str(s, max_set_bytes))
      return bad("an override is cut short or longer than 4096 bytes");
  if (!r.u64(n) || n > max_named_files)
    return bad("more than 64 named files");
  p.files.resize(static_cast<size_t>(n));
  for (auto& f : p.files) {
    if (!r.str(f.key, max_key_bytes) || f.key.empty())
      return bad("a named file's key is missing or longer than 256 bytes");
    if (!r.str(f.path, max_path_bytes) || f.path.empty())
      return bad("a named file's path is missing or longer than 4096 bytes");
    if (!r.str(f.digest, experiment_digest_bytes) || f.digest.size() != experiment_digest_bytes)
      return bad("a named file's digest is not 32 bytes");
    if (!r.u64(f.size) || f.size > max_served_file_bytes)
      return bad("a named file is larger than 64 MiB");
  }
  if (!r.str(p.digest, experiment_digest_bytes) || p.digest.size() != experiment_digest_bytes)
    return bad("the experiment digest is not 32 bytes");
  if (!r.str(p.signature, 64) || (!p.signature.empty() && p.signature.size() != 64))
    return bad("the signature is neither absent nor 64 bytes");
  if (r.pos >= bytes.size())
    return bad("the reachability verdict is missing");
  auto flag = static_cast<unsigned char>(bytes[r.pos++]);
  if (flag > 1)
    return bad("the reachability flag is neither 0 nor 1");
  p.reachable = flag == 1;
  if (!r.str(p.endpoint, max_endpoint_bytes) || !r.str(p.reach_detail, max_detail_bytes))
    return bad("the endpoint or its verdict is cut short or too long");
  if (r.pos != bytes.size())
    return bad("bytes follow its last field");
  return p;
}

status check_package_digest(const experiment_package& p) {
  if (experiment_digest(p.yaml, p.sets, p.files) != p.digest)
    return fail("the experiment's digest does not match its content (changed on the way, or "
                "a node serving another experiment than it says)");
  return {};
}

std::string experiment_signing_message(std::string_view digest, uint64_t nodes) {
  std::string m(signature_tag);
  m.push_back('\0');
  m.append(digest.data(), digest.size());
  put_u64(m, nodes);
  return m;
}

bool verify_experiment_signature(std::string_view authority_key, std::string_view digest,
                                 uint64_t nodes, std::string_view signature) {
  if (digest.size() != experiment_digest_bytes || nodes == 0 || nodes > max_package_nodes)
    return false;
  return actors::auth::verify_signature(authority_key, experiment_signing_message(digest, nodes),
                                        signature);
}

std::string format_experiment_signature(const experiment_signature& s) {
  return std::string(signature_tag) + " " + actors::auth::to_hex(s.digest) + " " +
         std::to_string(s.nodes) + " " + actors::auth::to_hex(s.signature) + "\n";
}

result<experiment_signature> parse_experiment_signature(std::string_view text) {
  auto form = "an experiment signature file is one line: " + std::string(signature_tag) +
              " <64 hex digits of the digest> <node count> <128 hex digits of the signature>";
  if (text.substr(0, signature_tag_v1.size()) == signature_tag_v1)
    return fail("an experiment signature of the first format, which does not bind the run's node "
                "count: sign the experiment again (starling authority sign-experiment FILE "
                "--nodes N)");
  auto head = std::string(signature_tag) + " ";
  // The exact form: tag, 64 hex digits, a decimal count, 128 hex digits, one newline.
  if (text.size() < head.size() + 64 + 1 + 1 + 1 + 128 + 1 ||
      text.size() > head.size() + 64 + 1 + 6 + 1 + 128 + 1 || text.substr(0, head.size()) != head ||
      text[head.size() + 64] != ' ' || text.back() != '\n')
    return fail(form);
  auto count = text.substr(head.size() + 65, text.size() - 1 - 128 - 1 - head.size() - 65);
  if (text[text.size() - 1 - 128 - 1] != ' ' || count.empty() || count.size() > 6 ||
      count[0] == '0')
    return fail(form);
  experiment_signature out;
  for (char c : count) {
    if (c < '0' || c > '9')
      return fail(form);
    out.nodes = out.nodes * 10 + static_cast<uint64_t>(c - '0');
  }
  if (out.nodes > max_package_nodes)
    return fail("an experiment signature's node count is above 100000");
  auto d = actors::auth::from_hex(text.substr(head.size(), 64));
  auto s = actors::auth::from_hex(text.substr(text.size() - 1 - 128, 128));
  if (!d || !s)
    return fail("an experiment signature file holds a character that is not a hex digit");
  out.digest = std::move(*d);
  out.signature = std::move(*s);
  return out;
}

std::string describe_package_difference(const experiment_package& mine,
                                        const experiment_package& theirs) {
  auto joined = [](const std::vector<std::string>& v, const char* sep) {
    std::string out;
    for (auto& x : v)
      out += (out.empty() ? "" : sep) + x;
    return out;
  };
  std::vector<std::string> parts;
  if (mine.yaml != theirs.yaml)
    parts.push_back("the file's bytes differ (" + std::to_string(mine.yaml.size()) +
                    " bytes here, " + std::to_string(theirs.yaml.size()) + " in the run)");
  if (mine.sets != theirs.sets) {
    auto list = [&](const std::vector<std::string>& v) {
      return v.empty() ? std::string{"none"} : joined(v, " ");
    };
    parts.push_back("the --set overrides differ (here: " + list(mine.sets) +
                    "; the run: " + list(theirs.sets) + ")");
  }
  std::map<std::string, const named_file*> ours;
  for (auto& f : mine.files)
    ours[f.key] = &f;
  std::vector<std::string> files;
  for (auto& f : theirs.files) {
    auto i = ours.find(f.key);
    if (i == ours.end()) {
      files.push_back(f.key + " (named only by the run's)");
      continue;
    }
    if (i->second->digest != f.digest || i->second->size != f.size)
      files.push_back(f.key + " (" + i->second->path + " holds other bytes)");
    ours.erase(i);
  }
  for (auto& kv : ours)
    files.push_back(kv.first + " (named only here)");
  if (!files.empty())
    parts.push_back(std::string{files.size() == 1 ? "named file " : "named files "} +
                    joined(files, ", "));
  if (parts.empty() && mine.digest != theirs.digest)
    parts.push_back("the digests differ");
  if (mine.nodes != theirs.nodes)
    parts.push_back("the node count differs (--nodes " + std::to_string(mine.nodes) + " here, " +
                    std::to_string(theirs.nodes) + " in the run)");
  return joined(parts, "; ");
}

std::string stored_file_name(const named_file& f) {
  auto slash = f.path.find_last_of('/');
  auto base = slash == std::string::npos ? f.path : f.path.substr(slash + 1);
  std::string clean;
  for (char c : base)
    clean.push_back((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                            c == '.' || c == '_' || c == '-'
                        ? c
                        : '_');
  if (clean.size() > 64)
    clean.resize(64);
  if (clean.empty() || clean == "." || clean == "..")
    clean = "file";
  return actors::auth::to_hex(f.digest).substr(0, 16) + "-" + clean;
}

} // namespace starling::runtime
