// The experiment a run serves to joiners (`starling join`): the file as the run started (its
// bytes and the `--set` overrides the node applied), the node count, every file it names (by key
// path, size and digest; fetched one by one by digest), the experiment's digest, the authority's
// signature of that digest in a closed run, and the serving gate's verdict on the joiner's
// endpoint (reachable or not, and why). Pure: no CAF, no YAML, no fmt (the decoders are fuzzed
// in the clang layer, tests/fuzz kind 16).
//
// The digest is BLAKE2b-256 over a domain tag, the file's bytes, the overrides, and each named
// file's key path, size and digest (not its path on the host: a joiner stores it elsewhere). The
// node count is not in it: it is how many numbered nodes the run was started with, not part of
// the file, and a node lying about it misplaces only its own joiners' plan. The signature is
// Ed25519 by the authority key over a second domain tag and the digest; `starling authority
// sign-experiment FILE` writes it beside the file as `FILE.sig` (one line, see
// `format_experiment_signature`), and a node of a closed run serves it with the experiment.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace starling::runtime {

/// Largest experiment file a node serves, in bytes.
inline constexpr size_t max_experiment_bytes = size_t{1} << 20;
/// Largest file an experiment names that a node serves, in bytes.
inline constexpr uint64_t max_served_file_bytes = uint64_t{64} << 20;
/// Most files one experiment names.
inline constexpr size_t max_named_files = 64;
/// Most `--set` overrides one package carries.
inline constexpr size_t max_package_sets = 64;
/// Bytes of an experiment or file digest (BLAKE2b-256).
inline constexpr size_t experiment_digest_bytes = 32;

/// A file an experiment names (a TorchScript block, a token file...).
struct named_file {
  /// Where the experiment names it (`dedloc.model.files[0]`), usable as a `--set` key path.
  std::string key;
  /// The path as the file says it (the serving node reads it there; a joiner stores it elsewhere).
  std::string path;
  /// BLAKE2b-256 of its bytes.
  std::string digest;
  /// Its size in bytes.
  uint64_t size = 0;
};

/// What a node serves a joiner (see the file comment).
struct experiment_package {
  /// The experiment file's bytes as the run started.
  std::string yaml;
  /// The `--set KEY=VALUE` overrides the serving node applied, in order.
  std::vector<std::string> sets;
  /// The run's numbered nodes (`--nodes`).
  uint64_t nodes = 0;
  /// The files it names.
  std::vector<named_file> files;
  /// `experiment_digest` of the above.
  std::string digest;
  /// The authority's signature of the digest (64 bytes), or empty (an open run, or not signed).
  std::string signature;
  /// Whether the serving node reached the joiner at the endpoint its hello claimed.
  bool reachable = false;
  /// That endpoint (empty: the joiner claimed none).
  std::string endpoint;
  /// Why it was not reached (empty when reached).
  std::string reach_detail;
};

/// BLAKE2b-256 of `bytes`.
std::string blake2b_256(std::string_view bytes);

/// The experiment's digest (see the file comment).
std::string experiment_digest(std::string_view yaml, const std::vector<std::string>& sets,
                              const std::vector<named_file>& files);

/// The package's bytes (sizes checked: a package `decode_package` would refuse is a failure).
result<std::string> encode_package(const experiment_package& p);

/// Parses a package (untrusted bytes): every size and count bounded, digests of 32 bytes, a
/// signature of 0 or 64 bytes, nothing after the last field. Does not check the digest.
result<experiment_package> decode_package(std::string_view bytes);

/// Checks that the package's digest is the digest of its content.
status check_package_digest(const experiment_package& p);

/// The message the authority signs for an experiment of digest `digest`.
std::string experiment_signing_message(std::string_view digest);

/// True when `signature` is the authority's (Ed25519 key `authority_key`) over `digest`.
bool verify_experiment_signature(std::string_view authority_key, std::string_view digest,
                                 std::string_view signature);

/// A signature file's text: `starling-experiment-signature-v1 <digest hex> <signature hex>\n`.
std::string format_experiment_signature(std::string_view digest, std::string_view signature);

/// A signature file's digest and signature (untrusted text: exact form, hex of the right sizes).
result<std::pair<std::string, std::string>> parse_experiment_signature(std::string_view text);

/// The name under which a joiner stores a named file: the first 16 hex digits of its digest, a
/// dash, and the path's last component with anything but `[A-Za-z0-9._-]` replaced by `_` (never
/// `.` or `..` alone, at most 64 characters).
std::string stored_file_name(const named_file& f);

} // namespace starling::runtime
