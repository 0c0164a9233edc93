#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine: installs the system packages the tests use
# when they are missing (apt-get, as root), then `cargo test --workspace --locked`.
# Arguments are passed to cargo test (e.g. `scripts/test.sh -p shepherd-store`).
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests run, and the Debian package that provides it.
need=()
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)         # the kubectl compatibility suite
# The Python client test runs Debian's python3-kubernetes (with /usr/bin/python3 unless SHEPHERD_PYTHON says).
dpkg-query -W -f='${Status}' python3-kubernetes 2>/dev/null | grep -q "ok installed" || need+=(python3-kubernetes)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)                    # pushes and pulls against `shepherd registry`
[ -x /bin/busybox ] || need+=(busybox-static)                           # the test images' userland
command -v runc >/dev/null 2>&1 || need+=(runc)                        # the `oci` runtime
command -v tmux >/dev/null 2>&1 || need+=(tmux)                        # drives `kubectl exec -it` in a terminal
command -v ip >/dev/null 2>&1 || need+=(iproute2)                    # test-made network namespaces (`ip netns`)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)               # runs a node agent inside one
command -v curl >/dev/null 2>&1 || need+=(curl)                        # requests from inside them
wget --version 2>/dev/null | grep -q 'GNU Wget' || need+=(wget)         # a client pod's wget by Service name
command -v nft >/dev/null 2>&1 || need+=(nftables)                     # the agent's Service data plane
command -v dig >/dev/null 2>&1 || need+=(bind9-dnsutils)               # queries the cluster DNS
[ -x /usr/bin/chromium ] || need+=(chromium)                            # the dashboard's browser tests
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)                 # ... driven over WebDriver
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)          # builds etcd-client (the store's etcd tests)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev) # ... with protobuf's own .proto files
[ -x /usr/bin/etcd ] || need+=(etcd-server)                             # the etcd backend's tests run a real etcd
command -v openssl >/dev/null 2>&1 || need+=(openssl)                  # makes an RSA ServiceAccount signing key
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: missing ${need[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

exec cargo test --workspace --locked "$@"
