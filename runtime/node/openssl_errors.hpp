// OpenSSL's per-thread error queue between caf_openssl's sessions.
//
// OpenSSL asks that a thread's error queue be empty before each TLS I/O call, or SSL_get_error()
// may report an earlier call's error for this one. caf_openssl 0.17 does not clear it: a session
// whose handshake failed (garbage, a port scan, a connection that left mid-handshake) leaves its
// errors in the I/O thread's queue (its log line, which would have drained it, is compiled out),
// and the next read of any other session on that thread that wants more data was taken as failed:
// anyone who could reach a TLS node's port broke its established connections, once per connection
// attempt. This process's definitions of the TLS I/O calls (SSL_read, SSL_write, SSL_accept,
// SSL_connect, SSL_do_handshake, SSL_shutdown, SSL_peek) come first in symbol lookup (the
// executable's own, also for libcaf_openssl), clear the queue and call libssl's.
#pragma once

namespace starling::runtime {

/// True when this process's TLS I/O calls go through the definitions above (they take
/// precedence over libssl's); a node with TLS says so in its log when not.
bool openssl_errors_guarded();

} // namespace starling::runtime
