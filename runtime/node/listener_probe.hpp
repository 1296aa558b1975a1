// Who listens at an endpoint: a probe that opens a connection to a CAF node's published port (TCP,
// or a TLS client session with the run's certificates, as caf_openssl speaks it), reads the BASP
// server handshake the listening node sends first (its CAF node id), and closes before answering
// it. The listening node's BASP broker adds a route only on a client handshake, so a probe leaves
// its routes, and any connection it already has with the probing node, as they were; the probing
// node's own middleman never sees the probe. Blocking: run it off the actors' threads.
//
// Under TLS a probe does not leave in the middle of a handshake: caf_openssl 0.17's session never
// clears OpenSSL's error queue after a failed handshake or read, and the stale error then failed
// the next `SSL_read` on any connection of that I/O thread (`SSL_get_error` peeks the queue), so
// a TCP connection that closed before completing its TLS handshake broke the listener's
// established TLS connections. Starling processes clear the queue before every TLS I/O call now
// (openssl_errors.hpp); a probe still finishes the handshakes it starts, for listeners without
// that (an older build).
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
  /// Under TLS, how much longer a connection and its handshake under way when `timeout` is up
  /// are carried on (the probe fails all the same) before the probe leaves: caf_openssl 0.17
  /// leaves the error of a handshake cut short in its I/O thread's OpenSSL error queue, where it
  /// fails that thread's next read of another connection (seen here: the listener's established
  /// connection broke). A probe leaves after a completed handshake, with a close_notify, or
  /// after a failed one, or past this grace.
  std::chrono::milliseconds tls_grace{5000};

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
/// `opts.timeout` once the name is resolved, plus `opts.tls_grace` while a TLS handshake is
/// under way at the deadline.
result<listener_identity> probe_listener(const std::string& host, uint16_t port,
                                         const probe_options& opts);

} // namespace starling::runtime
