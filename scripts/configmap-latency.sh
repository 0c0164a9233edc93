#!/usr/bin/env bash
# Measures how long a ConfigMap change takes to reach the file a running pod reads: starts
# `shepherd standalone` (needs root for the volume mount), runs a pod that logs each new content
# of its configMap volume's file with the time it saw it, patches the ConfigMap N times, and
# prints the median and p99 of (time seen in the pod - time the PATCH was sent).
#
#   sudo scripts/configmap-latency.sh [target/debug/shepherd] [changes, default 20]
set -euo pipefail

bin=${1:-target/debug/shepherd}
changes=${2:-20}
[ "$(id -u)" = 0 ] || { echo "needs root: the process runtime mounts volumes in a mount namespace" >&2; exit 1; }

dir=$(mktemp -d)
out="$dir/out"
"$bin" standalone --runtime process --pod-network host --data-dir "$dir/data" --listen 127.0.0.1:0 --insecure-loopback >"$out" 2>"$dir/err" &
pid=$!
cleanup() {
  # Containers outlive their agent by design: delete the pod and wait for it before stopping.
  if [ -n "${api:-}" ]; then
    curl -sf -X DELETE "$api/pods/lat?gracePeriodSeconds=1" >/dev/null || true
    for _ in $(seq 100); do curl -sf "$api/pods/lat" >/dev/null || break; sleep 0.1; done
  fi
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do grep -q "http://" "$out" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*' "$out" | head -1)
api="$url/api/v1/namespaces/default"

curl -sf -X POST "$api/configmaps" -H 'content-type: application/json' \
  -d '{"metadata":{"name":"lat"},"data":{"v":"0"}}' >/dev/null
curl -sf -X POST "$api/pods" -H 'content-type: application/json' -d '{
  "metadata": {"name": "lat"},
  "spec": {"containers": [{"name": "c", "image": "minimal",
    "command": ["sh", "-c", "last=; while :; do v=$(cat /srv/v); if [ \"$v\" != \"$last\" ]; then echo \"seen $v $(date +%s.%N)\"; last=$v; fi; sleep 0.005; done"],
    "volumeMounts": [{"name": "conf", "mountPath": "/srv"}]}],
    "volumes": [{"name": "conf", "configMap": {"name": "lat"}}]}}' >/dev/null

wait_seen() { # value -> the time the pod saw it
  for _ in $(seq 3000); do
    t=$(curl -sf "$api/pods/lat/log" | awk -v v="$1" '$1 == "seen" && $2 == v {print $3}' | tail -1)
    [ -n "$t" ] && { echo "$t"; return; }
    sleep 0.01
  done
  echo "value $1 never reached the pod" >&2; exit 1
}
wait_seen 0 >/dev/null

latencies=()
for i in $(seq "$changes"); do
  sent=$(date +%s.%N)
  curl -sf -X PATCH "$api/configmaps/lat" -H 'content-type: application/merge-patch+json' \
    -d "{\"data\":{\"v\":\"$i\"}}" >/dev/null
  seen=$(wait_seen "$i")
  latencies+=("$(echo "($seen - $sent) * 1000" | bc -l)")
done
printf '%s\n' "${latencies[@]}" | sort -n | awk '{a[NR]=$1} END {
  p50 = a[int((NR + 1) / 2)]; p99 = a[int(NR * 0.99 + 0.999)];
  printf "%d changes: median %.0f ms, p99 %.0f ms, min %.0f ms, max %.0f ms\n", NR, p50, p99, a[1], a[NR] }'
