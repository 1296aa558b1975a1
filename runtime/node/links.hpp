// A cluster node's TCP links as the operating system sees them: which ports this process
// listens on, and cutting every connection to another node's listening ports. A partition in
// cluster mode is carried out with these: each node of one side shuts its own sockets to the
// other side's ports down (its peers see the connection drop, as on a network failure) and its
// resolver refuses to connect there until the heal. Linux only (/proc/self/fd, /proc/net/tcp).
#pragma once

#include <cstdint>
#include <set>
#include <string>

namespace starling::runtime {

/// The TCP ports this process listens on (BASP, the data endpoint, averager data planes).
std::set<uint16_t> listening_ports();

/// Shuts down every TCP connection of this process whose remote end is `host` (an IPv4
/// literal) at one of `ports`. Returns how many sockets it shut down.
size_t cut_connections(const std::string& host, const std::set<uint16_t>& ports);

} // namespace starling::runtime
