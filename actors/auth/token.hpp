// Tokens: the run authority's signed statement that the holder of a node key may take part in an
// experiment with some roles until some time. Issued by `starling token issue`, shown in the hello,
// verified by every node (structure, authority, signature, experiment, times, deny list).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/auth/deny_list.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/refusal.hpp"
#include "actors/auth/signed.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {

/// Bytes of a token id.
inline constexpr size_t token_id_bytes = 16;
/// Most roles a token names.
inline constexpr size_t max_roles = 16;
/// Longest role name.
inline constexpr size_t max_role_chars = 32;
/// Largest signed token accepted, in bytes.
inline constexpr size_t max_token_bytes = 4096;
/// The role name that grants every role.
inline constexpr std::string_view any_role = "any";

/// The roles a token may grant (DESIGN.md, "Roles"), in a fixed order.
const std::vector<std::string>& known_roles();

/// Parses `NAME[,NAME...]` or `any` into role names: known names only, no repeats, `any` alone.
result<std::vector<std::string>> parse_roles(std::string_view list);

/// A token's content.
struct token {
  /// 16 random bytes naming the token (deny lists revoke it by this id).
  std::string id;
  /// The holder's 32-byte node public key.
  std::string peer_key;
  /// Role names, or just `any`.
  std::vector<std::string> roles;
  /// The run it admits to.
  std::string experiment;
  /// Issue time (Unix ns).
  int64_t issued_at_ns = 0;
  /// Expiry (Unix ns), after the issue time.
  int64_t expires_at_ns = 0;
  /// The signer's 32-byte public key.
  std::string authority_key;

  /// True when the token grants `role` (listed, or `any`).
  bool grants(std::string_view role) const;
  /// One line for logs and the CLI: id, peer id, roles, experiment, expiry (no secrets).
  std::string describe() const;
};

/// Signs `t` with `authority` (setting `authority_key`) and returns the `Signed` flat array.
/// Fails on fields out of range (ids, key size, roles, experiment, times).
result<std::string> encode_token(token t, const key_pair& authority);

/// Parses a signed token's structure and every field's range; does not check the signature.
checked<token> decode_token(std::string_view bytes);

/// Parses and verifies a signed token for the run of `trust` at `now_ns`: structure, authority,
/// signature, experiment, issue time (at most the skew ahead), expiry, and (when `deny` is given)
/// revocation of the token and bans of its key. Refusals name their reason.
checked<token> verify_token(std::string_view bytes, const trust_anchor& trust, int64_t now_ns,
                            const deny_list* deny = nullptr);

/// A token file's text: `starling-token-v1 <base64url of the signed token>` and a newline. More
/// text may follow (the certificates `starling token issue` appends); parsers ignore it.
std::string format_token_file(std::string_view signed_token);

/// The signed token of a token file's text (its first line); refusals are `malformed`.
checked<std::string> parse_token_file(std::string_view text, std::string_view what);

/// A token file as a node or a volunteer reads it: the file (at most 64 KiB), its signed token
/// (`parse_token_file`) and that token decoded (`decode_token`: structure and ranges, not the
/// signature). Fails with one line naming what is wrong.
struct token_file {
  /// The whole text (`starling token issue` appends certificates after the token).
  std::string text;
  std::string signed_token;
  token content;
};
result<token_file> read_token_file(const std::string& path);

} // namespace starling::actors::auth
