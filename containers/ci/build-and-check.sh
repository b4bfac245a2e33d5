#!/usr/bin/env bash
# Build gpunode's image with podman from the local Debian 12 base (no registry needed), then check it.
#
#   containers/ci/build-and-check.sh [TAG]        (default TAG: localhost/gpunode:ci)
#
# 1. containers/ci/base-image.sh: the mmdebstrap base, once per machine.
# 2. podman build -f containers/Containerfile with BUILD_IMAGE and RUNTIME_IMAGE both set to that base;
#    the host's CA bundle is mounted into the build (these machines re-sign TLS to the package index).
# 3. In the image, as its own non-root user (65532): every console script the installed gpunode
#    declares answers --help, `gpunode version` and `gpunode --version` print the version, and
#    `gpunode demo` runs to its end. pip, setuptools and wheel must be gone from /venv.
# Prints the build time (cached layers make a rebuild faster: remove the image for a cold figure) and
# the size gpunode adds over the base (nearly all of it the /venv layer). Exit 0 when all passed.
# Environment: GPUNODE_BASE_IMAGE, CONTAINERS_CONF (default containers/ci/containers.conf),
# GPUNODE_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt; empty: none mounted).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
base="${GPUNODE_BASE_IMAGE:-localhost/gpunode-debian12-py:latest}"
tag="${1:-localhost/gpunode:ci}"
ca="${GPUNODE_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"

"$here/base-image.sh"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)"
volumes=()
if [ -n "$ca" ] && [ -f "$ca" ]; then
  volumes=(-v "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
fi
start=$(date +%s%N)
podman build --quiet --layers -f "$repo/containers/Containerfile" -t "$tag" \
  --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" \
  --build-arg VERSION="$version" \
  --build-arg GIT_COMMIT="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "${volumes[@]}" "$repo" >/dev/null
build_ms=$(( ($(date +%s%N) - start) / 1000000 ))

# What gpunode adds over the base: the runtime stage's layers, of which /venv (the only directory copied
# from the build stage; LICENSE is a file) is nearly all.
image_bytes="$(podman image inspect --format '{{.Size}}' "$tag")"
base_bytes="$(podman image inspect --format '{{.Size}}' "$base")"
venv_layer="$(podman history --format '{{.Size}}|{{.CreatedBy}}' "$tag" | awk -F'|' '/COPY dir:/ {print $1; exit}')"

check=$(cat <<'PY'
import importlib.metadata as md, os, subprocess, sys
fail = []
def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail.append(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-800:]}")
    return p.stdout
print(f"uid {os.getuid()} gid {os.getgid()}")
if os.getuid() == 0:
    fail.append("the image runs as root")
scripts = sorted(e.name for e in md.distribution("gpunode").entry_points if e.group == "console_scripts")
for s in scripts:
    out = run(s, "--help")
    if "usage" not in out.lower():
        fail.append(f"{s} --help printed no usage")
print(f"--help: {len(scripts)} console scripts: {' '.join(scripts)}")
want = f"gpunode {md.version('gpunode')}\n"
for argv in (("gpunode", "version"), ("gpunode", "--version")):
    out = run(*argv)
    print(f"{' '.join(argv)}: {out.strip()}")
    if out != want:
        fail.append(f"{' '.join(argv)} printed {out!r}, want {want!r}")
demo = run("gpunode", "demo")
print(f"gpunode demo: {len(demo.splitlines())} lines, last: {demo.strip().splitlines()[-1] if demo.strip() else ''}")
left = [d for d in ("pip", "setuptools", "wheel", "_distutils_hack") if any(
    n.startswith(d) for n in os.listdir("/venv/lib/python3.11/site-packages"))]
if left:
    fail.append(f"left in /venv: {left}")
if fail:
    print("FAILED:\n" + "\n".join(fail))
    sys.exit(1)
print("image checks passed")
PY
)
podman run --rm --network none "$tag" python3 -c "$check"
venv_du="$(podman run --rm --network none --entrypoint du "$tag" -sh /venv | cut -f1)"
printf 'image %s: built in %d.%03d s; added over the base: %d bytes; the /venv layer: %s (du -sh /venv: %s)\n' \
  "$tag" $((build_ms / 1000)) $((build_ms % 1000)) $((image_bytes - base_bytes)) "$venv_layer" "$venv_du"
