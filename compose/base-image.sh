#!/usr/bin/env bash
# A local base image for the hopbus images, made from Debian packages, for hosts that cannot
# pull from a public image registry (air-gapped clusters, CI behind a mirror). Needs root,
# debootstrap and a reachable Debian mirror:
#   sudo compose/base-image.sh                 # builds hopbus-base:bookworm
#   sudo compose/base-image.sh TAG [MIRROR]
# Then, in compose/.env (or the environment): BASE_IMAGE=hopbus-base:bookworm and
# REDIS_IMAGE=hopbus-base:bookworm (the image has Python 3.11 with venv, and redis-server).
# The host's CA certificates go into the image, so pip inside image builds trusts what the
# host trusts (a TLS-inspecting proxy's CA, a private index's CA).
set -euo pipefail
TAG="${1:-hopbus-base:bookworm}"
MIRROR="${2:-${DEBIAN_MIRROR:-http://deb.debian.org/debian}}"
PACKAGES="python3,python3-venv,redis-server,ca-certificates,passwd"

fail() { echo "base-image.sh: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap makes device nodes and chroots)"
command -v debootstrap >/dev/null || fail "no debootstrap: apt-get install debootstrap"
command -v docker >/dev/null || fail "no docker command"
docker info >/dev/null 2>&1 || fail "the Docker engine does not answer (is dockerd running?)"

root="$(mktemp -d /var/tmp/hopbus-base.XXXXXX)"
log="$(mktemp /var/tmp/hopbus-base-log.XXXXXX)"
trap 'rm -rf "$root" "$log"' EXIT
echo "base-image.sh: debootstrap bookworm from $MIRROR ($PACKAGES)" >&2
if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$log" 2>&1
then
  tail -20 "$log" >&2
  fail "debootstrap failed (mirror $MIRROR): its last lines above"
fi
# The host's trust store: a host behind a TLS-inspecting proxy trusts its CA there.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["/bin/bash"]' \
  - "$TAG" >/dev/null
echo "$TAG"
