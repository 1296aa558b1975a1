# Network namespaces for emulated slow links, shared by scripts/netns-allreduce and
# scripts/netns-run (sourced, not run). N namespaces ${NETNS_PREFIX}n0.. (one per process), each
# joined to a bridge in a hub namespace by a veth pair whose two ends are limited with
# `tc tbf rate RATE` (upload on the peer's end, download on the hub's end). Addresses 10.77.0.1 ..
# 10.77.0.N, never routed outside the hub. Every namespace is removed when the sourcing script
# ends, fails or is interrupted; leftovers of a killed earlier run (its shell gone) are removed
# first.

# netns_require NAME: root, iproute2 and sane N/RATE (netns_n, netns_rate) or exit 2.
netns_require() {
  [ "$(id -u)" = 0 ] || { echo "$1: network namespaces need root" >&2; exit 2; }
  command -v ip >/dev/null && command -v tc >/dev/null \
    || { echo "$1: needs iproute2 (ip, tc)" >&2; exit 2; }
  [[ "$netns_n" =~ ^[0-9]+$ ]] && [ "$netns_n" -ge 2 ] && [ "$netns_n" -le 16 ] \
    || { echo "$1: N must be 2..16, got '$netns_n'" >&2; exit 2; }
  [[ "$netns_rate" =~ ^[0-9]+(bit|kbit|mbit|gbit)$|^none$ ]] \
    || { echo "$1: RATE like 200mbit (or none), got '$netns_rate'" >&2; exit 2; }
}

NETNS_PREFIX="stl$$"

netns_cleanup() {
  for ((i = 0; i < netns_n; i++)); do ip netns del "${NETNS_PREFIX}n$i" 2>/dev/null || true; done
  ip netns del "${NETNS_PREFIX}hub" 2>/dev/null || true
}

# tbf: RATE, a 256 KiB bucket (10 ms at 200mbit) and at most 50 ms of queue; `none`: unlimited.
netns_shape() { # namespace device
  [ "$netns_rate" = none ] && return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$netns_rate" burst 256kb latency 50ms
}

# netns_up: creates the hub and N namespaces (netns_n, netns_rate set by the caller).
netns_up() {
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM HUP
  local ns owner p="$NETNS_PREFIX"
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^stl[0-9]+(hub|n[0-9]+)$' || true); do
    owner=${ns#stl}
    owner=${owner%%[hn]*}
    kill -0 "$owner" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
  done
  ip netns add "${p}hub"
  ip -n "${p}hub" link add br0 type bridge
  ip -n "${p}hub" link set br0 up
  for ((i = 0; i < netns_n; i++)); do
    ns="${p}n$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${p}a$i" type veth peer name "${p}b$i"
    ip link set "${p}a$i" netns "$ns"
    ip link set "${p}b$i" netns "${p}hub"
    ip -n "$ns" link set "${p}a$i" name eth0
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "${p}hub" link set "${p}b$i" master br0
    ip -n "${p}hub" link set "${p}b$i" up
    netns_shape "$ns" eth0
    netns_shape "${p}hub" "${p}b$i"
  done
}
