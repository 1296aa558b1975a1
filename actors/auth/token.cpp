#include "actors/auth/token.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include <capnp/message.h>

#include "messages/auth.capnp.h"
#include "messages/wire.hpp"

namespace starling::actors::auth {

namespace {

inline constexpr uint16_t token_format_version = 1;
constexpr std::string_view token_file_prefix = "starling-token-v1 ";

bool role_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

std::string known_list() {
  std::string s;
  for (auto& r : known_roles())
    s += (s.empty() ? "" : ", ") + r;
  return s + ", or any";
}

/// Checks the token's fields (shared by the encoder and the decoder).
status check_fields(const token& t) {
  if (t.id.size() != token_id_bytes)
    return fail("a token id is 16 bytes, got " + std::to_string(t.id.size()));
  if (t.peer_key.size() != public_key_bytes)
    return fail("a peer key is 32 bytes, got " + std::to_string(t.peer_key.size()));
  if (t.authority_key.size() != public_key_bytes)
    return fail("an authority key is 32 bytes, got " + std::to_string(t.authority_key.size()));
  if (t.roles.empty() || t.roles.size() > max_roles)
    return fail("a token names 1..16 roles, got " + std::to_string(t.roles.size()));
  for (auto& r : t.roles) {
    if (r.empty() || r.size() > max_role_chars || !std::all_of(r.begin(), r.end(), role_char))
      return fail("a role name has 1..32 characters of [a-z0-9_-]");
    if (r == any_role && t.roles.size() != 1)
      return fail("'any' is a token's only role");
    if (std::count(t.roles.begin(), t.roles.end(), r) != 1)
      return fail("role '" + r + "' named twice");
  }
  if (auto st = check_experiment_id(t.experiment); !st)
    return st;
  if (t.issued_at_ns < 0 || t.expires_at_ns <= t.issued_at_ns)
    return fail("a token expires after it is issued (Unix ns >= 0)");
  return {};
}

checked<token> decode_body(const sealed& s) {
  token t;
  auto st = messages::read_flat(s.body.data(), s.body.size(), [&](capnp::MessageReader& r) -> status {
    auto b = r.getRoot<wire::TokenBody>();
    if (b.getFormatVersion() != token_format_version)
      return fail("token format " + std::to_string(b.getFormatVersion()) + ", expected 1");
    auto bytes = [](capnp::Data::Reader d) {
      return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
    };
    t.id = bytes(b.getTokenId());
    t.peer_key = bytes(b.getPeerKey());
    t.authority_key = bytes(b.getAuthorityKey());
    auto roles = b.getRoles();
    if (roles.size() > max_roles)
      return fail("a token names at most 16 roles, got " + std::to_string(roles.size()));
    for (auto r : roles)
      t.roles.emplace_back(r.begin(), r.size());
    auto exp = b.getExperimentId();
    t.experiment.assign(exp.begin(), exp.size());
    t.issued_at_ns = b.getIssuedAtNs();
    t.expires_at_ns = b.getExpiresAtNs();
    return check_fields(t);
  });
  if (!st)
    return refuse(reason::malformed, "token: " + st.what());
  return t;
}

} // namespace

const std::vector<std::string>& known_roles() {
  static const std::vector<std::string> roles = {"trainer", "stage",     "averager", "dht",
                                                 "monitor", "validator", "dp_peer",  "collab"};
  return roles;
}

result<std::vector<std::string>> parse_roles(std::string_view list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    auto comma = list.find(',', pos);
    auto name = std::string{list.substr(pos, comma == std::string_view::npos ? list.npos : comma - pos)};
    if (name.empty())
      return fail("--role: expected NAME[,NAME...] or any, got \"" + std::string{list} + "\"");
    if (name != any_role
        && std::find(known_roles().begin(), known_roles().end(), name) == known_roles().end())
      return fail("--role: unknown role '" + name + "' (known: " + known_list() + ")");
    if (std::find(out.begin(), out.end(), name) != out.end())
      return fail("--role: '" + name + "' named twice");
    out.push_back(std::move(name));
    if (comma == std::string_view::npos)
      break;
    pos = comma + 1;
  }
  if (out.size() > 1 && std::find(out.begin(), out.end(), any_role) != out.end())
    return fail("--role: 'any' grants every role and stands alone");
  return out;
}

bool token::grants(std::string_view role) const {
  for (auto& r : roles)
    if (r == any_role || r == role)
      return true;
  return false;
}

std::string token::describe() const {
  std::string roles_text;
  for (auto& r : roles)
    roles_text += (roles_text.empty() ? "" : ",") + r;
  return "token " + to_hex(id).substr(0, 12) + " for peer " + to_hex(peer_id_of(peer_key)).substr(0, 12)
         + " roles " + roles_text + " experiment " + experiment + " issued "
         + format_time(issued_at_ns) + " expires " + format_time(expires_at_ns);
}

result<std::string> encode_token(token t, const key_pair& authority) {
  t.authority_key = authority.public_key();
  if (auto st = check_fields(t); !st)
    return fail(st.what());
  capnp::MallocMessageBuilder b;
  auto body = b.initRoot<wire::TokenBody>();
  auto data = [](const std::string& s) {
    return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
  };
  body.setFormatVersion(token_format_version);
  body.setTokenId(data(t.id));
  body.setPeerKey(data(t.peer_key));
  auto roles = body.initRoles(static_cast<unsigned>(t.roles.size()));
  for (unsigned i = 0; i < t.roles.size(); ++i)
    roles.set(i, t.roles[i]);
  body.setExperimentId(t.experiment);
  body.setIssuedAtNs(t.issued_at_ns);
  body.setExpiresAtNs(t.expires_at_ns);
  body.setAuthorityKey(data(t.authority_key));
  std::vector<char> flat;
  messages::write_flat(b, flat);
  return seal(token_domain, std::string_view(flat.data(), flat.size()), authority);
}

checked<token> decode_token(std::string_view bytes) {
  auto s = unseal(bytes, max_token_bytes, "token");
  if (!s)
    return s.error();
  return decode_body(*s);
}

checked<token> verify_token(std::string_view bytes, const trust_anchor& trust, int64_t now_ns,
                            const deny_list* deny) {
  auto s = unseal(bytes, max_token_bytes, "token");
  if (!s)
    return s.error();
  auto t = decode_body(*s);
  if (!t)
    return t;
  if (trust.open())
    return refuse(reason::wrong_authority, "this run is open (no authority); tokens mean nothing");
  if (t->authority_key != trust.authority_key)
    return refuse(reason::wrong_authority, "token signed by authority "
                                             + to_hex(t->authority_key).substr(0, 16)
                                             + ", this run's authority is "
                                             + to_hex(trust.authority_key).substr(0, 16));
  if (!verify_sealed(token_domain, *s, trust.authority_key))
    return refuse(reason::forged, "the token's signature does not verify with the authority key");
  if (t->experiment != trust.experiment)
    return refuse(reason::foreign_experiment, "token for experiment '" + t->experiment
                                                + "', this run is '" + trust.experiment + "'");
  if (t->issued_at_ns > now_ns + trust.max_clock_skew_ns)
    return refuse(reason::not_yet_valid, "token issued at " + format_time(t->issued_at_ns)
                                           + ", in the future (now " + format_time(now_ns) + ")");
  if (now_ns >= t->expires_at_ns)
    return refuse(reason::expired, "token expired at " + format_time(t->expires_at_ns) + " (now "
                                     + format_time(now_ns) + ")");
  if (deny) {
    if (auto e = deny->revoked(t->id, now_ns))
      return refuse(reason::revoked, "token " + to_hex(t->id).substr(0, 12) + " revoked: "
                                       + (e->reason.empty() ? "no reason given" : e->reason));
    if (auto e = deny->banned(t->peer_key, now_ns))
      return refuse(reason::banned, "peer " + to_hex(peer_id_of(t->peer_key)).substr(0, 12)
                                      + " banned: "
                                      + (e->reason.empty() ? "no reason given" : e->reason));
  }
  return t;
}

std::string format_token_file(std::string_view signed_token) {
  std::string b64(sodium_base64_ENCODED_LEN(signed_token.size(),
                                            sodium_base64_VARIANT_URLSAFE_NO_PADDING),
                  '\0');
  sodium_bin2base64(b64.data(), b64.size(),
                    reinterpret_cast<const unsigned char*>(signed_token.data()),
                    signed_token.size(), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
  b64.resize(std::strlen(b64.c_str()));
  return std::string{token_file_prefix} + b64 + "\n";
}

checked<std::string> parse_token_file(std::string_view text, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return refuse(reason::malformed, std::string{what} + ": " + why);
  };
  if (text.substr(0, token_file_prefix.size()) != token_file_prefix)
    return bad("expected a first line 'starling-token-v1 <token>'");
  auto end = text.find('\n');
  if (end == std::string_view::npos)
    return bad("the token line does not end");
  auto b64 = text.substr(token_file_prefix.size(), end - token_file_prefix.size());
  // Base64 of at most max_token_bytes.
  if (b64.empty() || b64.size() > (max_token_bytes * 4) / 3 + 4)
    return bad("a token line of " + std::to_string(b64.size()) + " characters");
  std::string out(b64.size(), '\0');
  size_t len = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), b64.data(),
                        b64.size(), nullptr, &len, nullptr,
                        sodium_base64_VARIANT_URLSAFE_NO_PADDING)
      != 0)
    return bad("the token is not base64url");
  out.resize(len);
  return out;
}

result<token_file> read_token_file(const std::string& path) {
  auto text = read_small_file(path, 64 * 1024);
  if (!text)
    return fail(text.error().what);
  auto signed_token = parse_token_file(*text, path);
  if (!signed_token)
    return fail(signed_token.error().line());
  auto decoded = decode_token(*signed_token);
  if (!decoded)
    return fail(decoded.error().line());
  return token_file{std::move(*text), std::move(*signed_token), std::move(*decoded)};
}

} // namespace starling::actors::auth
