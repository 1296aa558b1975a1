// The run authority's folder (`starling authority init --out DIR`): its key pair, the experiment
// it admits to, its CA certificate, its deny list and a log of the tokens it issued; and issuing
// tokens (`starling token issue`), each with the node certificate for encrypted channels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/auth/deny_list.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/signed.hpp"
#include "actors/auth/token.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {

/// File names inside an authority folder.
struct authority_layout {
  /// The authority's secret key (mode 0600).
  static constexpr const char* key = "authority.key";
  /// Its public key: what every node of the run trusts.
  static constexpr const char* public_key = "authority.pub";
  /// The experiment id, one line.
  static constexpr const char* experiment = "experiment";
  /// The run's CA certificate (PEM), for caf_openssl's `openssl_cafile`.
  static constexpr const char* ca = "ca.crt";
  /// The current signed deny list.
  static constexpr const char* deny = "deny.list";
  /// One line per issued token (id, peer, roles, expiry), to find what to revoke.
  static constexpr const char* issued = "issued.log";
};

/// A loaded authority.
struct authority {
  /// The folder it lives in.
  std::string dir;
  /// Its key pair.
  key_pair key;
  /// The experiment its tokens admit to.
  std::string experiment;
  /// Its CA certificate (PEM).
  std::string ca_pem;

  /// What the run's nodes trust.
  trust_anchor trust() const;
};

/// Settings of `init_authority`.
struct authority_init_options {
  /// The folder to create (or an empty existing one).
  std::string dir;
  /// The experiment id; empty: `run-` and the first 12 hex digits of the authority's peer id.
  std::string experiment;
  /// Now (Unix ns): the CA's start of validity and the deny list's issue time.
  int64_t now_ns = 0;
  /// How long the CA certificate is valid. Default 10 years.
  int64_t ca_validity_ns = int64_t{10} * 365 * 24 * 3600 * 1'000'000'000;
};

/// Creates an authority folder: a fresh key pair, the experiment, a CA certificate and an empty
/// signed deny list (serial 1). Refuses a folder that already holds an authority key.
result<authority> init_authority(const authority_init_options& opts);

/// Loads the authority of `dir` (its key must be mode 0600; the CA must certify its key).
result<authority> load_authority(const std::string& dir);

/// What to issue.
struct issue_options {
  /// The holder's node public key (32 bytes).
  std::string peer_key;
  /// Role names (see `parse_roles`).
  std::vector<std::string> roles;
  /// Now (Unix ns): the token's issue time.
  int64_t now_ns = 0;
  /// How long the token (and its certificate) is valid, > 0.
  int64_t valid_ns = 0;
  /// The token id (16 bytes); empty: random.
  std::string token_id;
};

/// An issued token.
struct issued_token {
  /// Its content.
  token content;
  /// The signed token (flat array).
  std::string signed_token;
  /// The token file's text: the token line, then the node's certificate and the CA certificate
  /// (PEM), everything the holder needs to join.
  std::string file_text;
};

/// Issues a token and the node certificate for it, and appends a line to the issued log.
result<issued_token> issue_token(const authority& a, const issue_options& opts);

/// Adds `entry` to the authority's deny list, signs it with the next serial and writes it.
/// Returns the signed list.
result<std::string> deny(const authority& a, deny_entry entry, int64_t now_ns);

/// Writes `text` to `path` with `mode`, replacing it atomically (temporary file and rename).
status write_file_atomically(const std::string& path, const std::string& text, unsigned mode);

} // namespace starling::actors::auth
