#include "runtime/node/links.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace starling::runtime {

namespace {

/// One line of /proc/net/tcp: local and remote address, state, inode.
struct tcp_entry {
  uint32_t local_ip = 0;
  uint16_t local_port = 0;
  uint32_t remote_ip = 0;
  uint16_t remote_port = 0;
  int state = 0;
  unsigned long inode = 0;
};

/// Parses `0100007F:1F90` (network-order address in hex as the kernel prints it, port in hex).
bool parse_addr(const std::string& text, uint32_t& ip, uint16_t& port) {
  auto colon = text.find(':');
  if (colon != 8)
    return false;
  char* end = nullptr;
  ip = static_cast<uint32_t>(std::strtoul(text.substr(0, 8).c_str(), &end, 16));
  port = static_cast<uint16_t>(std::strtoul(text.substr(9).c_str(), &end, 16));
  return true;
}

std::vector<tcp_entry> read_tcp_table() {
  std::vector<tcp_entry> out;
  std::ifstream in{"/proc/net/tcp"};
  std::string line;
  std::getline(in, line); // header
  while (std::getline(in, line)) {
    std::istringstream ss{line};
    std::string sl, local, remote, st, queues, tr, retr, uid, timeout;
    tcp_entry e;
    if (!(ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> e.inode))
      continue;
    if (!parse_addr(local, e.local_ip, e.local_port) || !parse_addr(remote, e.remote_ip, e.remote_port))
      continue;
    e.state = static_cast<int>(std::strtol(st.c_str(), nullptr, 16));
    out.push_back(e);
  }
  return out;
}

/// Socket inode -> file descriptor of this process.
std::map<unsigned long, int> socket_fds() {
  std::map<unsigned long, int> out;
  if (auto* dir = ::opendir("/proc/self/fd")) {
    while (auto* ent = ::readdir(dir)) {
      char path[64];
      std::snprintf(path, sizeof(path), "/proc/self/fd/%s", ent->d_name);
      char target[64] = {};
      auto n = ::readlink(path, target, sizeof(target) - 1);
      if (n <= 0)
        continue;
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1)
        out[inode] = std::atoi(ent->d_name);
    }
    ::closedir(dir);
  }
  return out;
}

constexpr int tcp_established = 0x01;
constexpr int tcp_listen = 0x0A;

} // namespace

std::set<uint16_t> listening_ports() {
  std::set<uint16_t> out;
  auto fds = socket_fds();
  for (auto& e : read_tcp_table())
    if (e.state == tcp_listen && fds.count(e.inode))
      out.insert(e.local_port);
  return out;
}

size_t cut_connections(const std::string& host, const std::set<uint16_t>& ports) {
  in_addr addr{};
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr) != 1)
    return 0;
  auto fds = socket_fds();
  size_t cut = 0;
  for (auto& e : read_tcp_table()) {
    if (e.state != tcp_established || e.remote_ip != addr.s_addr || !ports.count(e.remote_port))
      continue;
    auto i = fds.find(e.inode);
    if (i == fds.end())
      continue;
    // Shutting down (not closing) keeps the descriptor valid for its owner, which then sees
    // the connection end as on a network failure.
    if (::shutdown(i->second, SHUT_RDWR) == 0)
      cut++;
  }
  return cut;
}

} // namespace starling::runtime
