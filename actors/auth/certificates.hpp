// X.509 certificates for caf_openssl's encrypted channels, made with OpenSSL's C API (no `openssl`
// binary at run time, errors reported in-process). The run's CA is the authority's own Ed25519
// key, self-signed; a node's certificate certifies its node key (the same key as its peer id), so
// issuing one needs only the node's public key and TLS proves both membership and identity.
// Checked here: OpenSSL 3.0 negotiates TLS 1.2 (caf_openssl's only method) with Ed25519
// certificates under CAF's cipher list "HIGH:!aNULL:!MD5" (ECDHE-ECDSA-AES256-GCM-SHA384).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/auth/identity.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {

/// The run's CA certificate (PEM): self-signed by the authority key, CA:TRUE, naming the
/// experiment, valid in [not_before_ns, not_after_ns] (Unix ns).
result<std::string> make_ca_certificate(const key_pair& authority, std::string_view experiment,
                                        int64_t not_before_ns, int64_t not_after_ns);

/// A node certificate (PEM) for the Ed25519 `node_public_key`, signed by the authority: subject
/// CN = the node's peer id in hex, issuer = the CA's subject, CA:FALSE, TLS client and server,
/// serial = `serial` (e.g. the token id; 1..20 bytes).
result<std::string> make_node_certificate(const key_pair& authority, std::string_view experiment,
                                          std::string_view node_public_key,
                                          std::string_view serial, int64_t not_before_ns,
                                          int64_t not_after_ns);

/// The key pair's secret key as unencrypted PKCS#8 PEM (caf_openssl's `openssl_key` file; keep it
/// mode 0600 like the key file it derives from).
result<std::string> private_key_pem(const key_pair& key);

/// Verifies that `cert_pem` was issued by the CA of `ca_pem` and is valid at `now_ns`; returns
/// the certified Ed25519 public key (32 bytes).
result<std::string> verify_certificate(std::string_view ca_pem, std::string_view cert_pem,
                                       int64_t now_ns);

/// The Ed25519 public key (32 bytes) a PEM certificate certifies (no chain or time check).
result<std::string> certified_key(std::string_view cert_pem);

/// The PEM certificate blocks found in `text`, in order.
std::vector<std::string> pem_certificates(std::string_view text);

} // namespace starling::actors::auth
