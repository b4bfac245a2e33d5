#!/usr/bin/env bash
# A Debian 12 base image with python3, made locally (no container registry needed) and kept in podman's
# store: the base of the container tests and of the image build in CI.
#
#   containers/ci/base-image.sh [--force]
#
# mmdebstrap bootstraps bookworm (minbase + python3, python3-venv, python3-pip, ca-certificates) into a
# tar, `podman import` makes it $GPUNODE_BASE_IMAGE (default localhost/gpunode-debian12-py:latest).
# Nothing is done when the image exists already (unless --force): the first run on a machine takes
# about 40 s, later ones a fraction of a second. Concurrent runs wait for each other (flock).
# Environment: GPUNODE_BASE_IMAGE, GPUNODE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# GPUNODE_DEBIAN_SECURITY (default http://deb.debian.org/debian-security), CONTAINERS_CONF (default:
# containers/ci/containers.conf next to this script).
# Exit 0: the image exists; 1: it could not be made (the reason on stderr).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
image="${GPUNODE_BASE_IMAGE:-localhost/gpunode-debian12-py:latest}"
mirror="${GPUNODE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${GPUNODE_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac
for tool in podman mmdebstrap flock; do
  command -v "$tool" >/dev/null || { echo "base-image: $tool is not installed (apt-get install podman mmdebstrap)" >&2; exit 1; }
done

exec 9>"${TMPDIR:-/tmp}/gpunode-base-image.lock"
flock 9
if [ "$force" = 0 ] && podman image exists "$image"; then
  echo "base-image: $image exists"
  exit 0
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/gpunode-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
if ! mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$work/rootfs.tar" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main" >"$work/mmdebstrap.log" 2>&1; then
  tail -20 "$work/mmdebstrap.log" >&2
  echo "base-image: mmdebstrap failed (mirror $mirror)" >&2
  exit 1
fi
podman import --quiet --change 'CMD ["/usr/bin/python3"]' "$work/rootfs.tar" "$image" >/dev/null
echo "base-image: made $image in $(( $(date +%s) - start )) s"
