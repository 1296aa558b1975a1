// Who listens at an endpoint: a probe that opens a connection to a CAF node's published port (TCP,
// or a TLS client session with the run's certificates, as caf_openssl speaks it), reads the BASP
// server handshake the listening node sends first (its CAF node id), and closes before answering
// it. The listening node's BASP broker adds a route only on a client handshake, so a probe leaves
// its routes, and any connection it already has with the probing node, as they were; the probing
// node's own middleman never sees the probe. Blocking: run it off the actors' threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/node_id.hpp>

#include "kernels/result.hpp"

namespace starling::runtime {

/// Settings of a probe.
struct probe_options {
  /// The longest a probe takes: connect, TLS handshake and server handshake together (name
  /// resolution aside).
  std::chrono::milliseconds timeout{500};
  /// PEM file of this node's certificate (caf_openssl's `openssl_certificate`); empty: plain TCP.
  std::string certificate;
  /// PEM file of this node's private key (`openssl_key`).
  std::string key;
  /// PEM file of the run's CA (`openssl_cafile`): the listener's certificate must chain to it.
  std::string cafile;
  /// The largest server-handshake payload read (a hostile listener cannot make a probe allocate
  /// more).
  uint32_t max_payload = 64 * 1024;

  /// True when probes speak TLS.
  bool tls() const { return !certificate.empty(); }
};

/// What the node listening at an endpoint showed a probe.
struct listener_identity {
  /// The CAF node id of its BASP server handshake.
  caf::node_id node;
  /// Under TLS: the Ed25519 public key (32 bytes) its certificate certifies, the certificate
  /// verified against the run's CA; empty over plain TCP.
  std::string certified_key;
};

/// Probes `host:port` (a name or an IP literal) with `opts`: the listener's identity, or why none
/// was learned (nothing listens, not the run's TLS, not a CAF node, too slow). Blocks at most
/// `opts.timeout` once the name is resolved.
result<listener_identity> probe_listener(const std::string& host, uint16_t port,
                                         const probe_options& opts);

} // namespace starling::runtime
