#!/bin/sh
# Runs `shepherd standalone` inside a network namespace of its own (made if missing), so that its
# pod network (bridge shep0, routes, nftables tables) lives there and the machine's own network is
# left as it was. Arguments go to `shepherd standalone`. Reach the cluster from the same namespace:
#   nsenter --net=/run/netns/shepherd -- kubectl --kubeconfig shepherd-data/admin.kubeconfig get pods
# Environment: SHEPHERD_NETNS (namespace name, default shepherd), SHEPHERD_BIN (default
# target/release/shepherd). Needs root, iproute2 and nsenter (util-linux).
set -eu
name=${SHEPHERD_NETNS:-shepherd}
bin=${SHEPHERD_BIN:-target/release/shepherd}
[ -e "/run/netns/$name" ] || ip netns add "$name"
ip -n "$name" link set lo up
exec nsenter --net="/run/netns/$name" -- "$bin" standalone "$@"
