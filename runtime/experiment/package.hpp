// The experiment a run serves to joiners (`starling join`): the file as the run started (its
// bytes and the `--set` overrides the node applied), the node count, every file it names (by key
// path, size and digest; fetched one by one by digest), the experiment's digest, the authority's
// signature of that digest in a closed run, and the serving gate's verdict on the joiner's
// endpoint (reachable or not, and why). Pure: no CAF, no YAML, no fmt (the decoders are fuzzed
// in the clang layer, tests/fuzz kind 16).
//
// The digest is BLAKE2b-256 over a domain tag, the file's bytes, the overrides, and each named
// file's key path, size and digest (not its path on the host: a joiner stores it elsewhere). The
// node count is not in it (it is how many numbered nodes the run was started with, not part of
// the file), but the signature binds it: Ed25519 by the authority key over a second domain tag,
// the digest and the node count, so that a joiner trusts no count the authority did not sign (a
// joiner's plan, its slot and every `@<node>/<name>` address it uses follow from the count).
// `starling authority sign-experiment FILE --nodes N` writes it beside the file as `FILE.sig`
// (one line, see `format_experiment_signature`); a node of a closed run started with another
// `--nodes` serves no experiment (it says to sign again), and serves the signature with it.
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
/// Largest node count a package or a signature carries.
inline constexpr uint64_t max_package_nodes = 100000;
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
  /// The authority's signature of the digest and the node count (64 bytes), or empty (an open
  /// run, or not signed).
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

/// The message the authority signs for an experiment of digest `digest` run on `nodes` nodes.
std::string experiment_signing_message(std::string_view digest, uint64_t nodes);

/// True when `signature` is the authority's (Ed25519 key `authority_key`) over `digest` and
/// `nodes`.
bool verify_experiment_signature(std::string_view authority_key, std::string_view digest,
                                 uint64_t nodes, std::string_view signature);

/// What an experiment signature file holds.
struct experiment_signature {
  /// The experiment's digest (32 bytes).
  std::string digest;
  /// The node count it was signed for.
  uint64_t nodes = 0;
  /// The authority's signature (64 bytes).
  std::string signature;
};

/// A signature file's text:
/// `starling-experiment-signature-v2 <digest hex> <nodes> <signature hex>\n`.
std::string format_experiment_signature(const experiment_signature& s);

/// A signature file's content (untrusted text: exact form, hex of the right sizes, a node count
/// in [1, 100000]); a file of the first format (no node count) is refused with the fix.
result<experiment_signature> parse_experiment_signature(std::string_view text);

/// One line saying how `theirs` (the run's package) differs from `mine` (this node's): the
/// file's bytes, the overrides, a named file, or the node count; empty when the digests and the
/// node counts are equal.
std::string describe_package_difference(const experiment_package& mine,
                                        const experiment_package& theirs);

/// The name under which a joiner stores a named file: the first 16 hex digits of its digest, a
/// dash, and the path's last component with anything but `[A-Za-z0-9._-]` replaced by `_` (never
/// `.` or `..` alone, at most 64 characters).
std::string stored_file_name(const named_file& f);

} // namespace starling::runtime
