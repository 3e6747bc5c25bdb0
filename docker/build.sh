#!/usr/bin/env bash
# docker/build.sh: build kiln's container images with buildah, no daemon
# needed.
#
#   docker/build.sh [--local-base] [--go-cache] [--prefix NAME] [TARGET ...]
#
# TARGETs are stages of docker/Dockerfile (default: tracker compiler
# device-cpu; device-cuda needs the NVIDIA base image from a registry).
# Images are named PREFIX-TARGET (default prefix localhost/kiln).
#
#   --local-base  make the base images here from Debian packages instead of
#                 pulling golang:… and debian:…-slim: mmdebstrap makes a
#                 minimal Debian (once; kept as localhost/kiln-base), and the
#                 build image adds gcc and this machine's Go toolchain to it
#                 (localhost/kiln-build-base). For machines that reach
#                 Debian's mirrors and the Go module proxy but no registry.
#   --go-cache    mount this machine's Go module and build caches into the
#                 build stage, so a rebuild compiles only what changed.
#
# Environment: STORAGE_DRIVER (buildah's; default vfs, which works inside
# containers and VMs), DEBIAN (default bookworm), MIRROR (Debian mirror for
# mmdebstrap; default http://deb.debian.org/debian).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

local_base="" go_cache="" prefix="localhost/kiln"
targets=()
while [ $# -gt 0 ]; do
	case "$1" in
	--local-base) local_base=1 ;;
	--go-cache) go_cache=1 ;;
	--prefix) prefix="$2"; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "docker/build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) targets+=("$1") ;;
	esac
	shift
done
[ ${#targets[@]} -gt 0 ] || targets=(tracker compiler device-cpu)

for tool in buildah; do
	command -v "$tool" >/dev/null || { echo "docker/build.sh: $tool is not installed (Debian: apt-get install buildah)" >&2; exit 1; }
done
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
debian="${DEBIAN:-bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
bah() { buildah --storage-driver "$STORAGE_DRIVER" "$@"; }
have_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

args=(--build-arg "DEBIAN=$debian")
if [ -n "$local_base" ]; then
	base="localhost/kiln-base:$debian"
	build_base="localhost/kiln-build-base:$debian"
	if ! have_image "$base"; then
		command -v mmdebstrap >/dev/null || { echo "docker/build.sh: --local-base needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
		tmp="$(mktemp -d)"
		trap 'rm -rf "$tmp"' EXIT
		echo "docker/build.sh: making $base with mmdebstrap ($debian minbase from $mirror)" >&2
		mmdebstrap --variant=minbase --quiet "$debian" "$tmp/rootfs.tar" "$mirror"
		c="$(bah from scratch)"
		bah add "$c" "$tmp/rootfs.tar" /
		bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
		bah commit --quiet --rm "$c" "$base" >/dev/null
	fi
	# The build image is rebuilt when this machine's Go or CA bundle changes.
	goroot="$(go env GOROOT)"
	gover="$(go env GOVERSION)"
	stamp="$gover $(cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null | sha256sum | cut -c1-16)"
	if ! have_image "$build_base" || [ "$(bah inspect --type image --format '{{index .ImageAnnotations "kiln.stamp"}}' "$build_base" 2>/dev/null)" != "$stamp" ]; then
		echo "docker/build.sh: making $build_base ($base with gcc and $gover)" >&2
		c="$(bah from "$base")"
		bah run --isolation chroot "$c" -- sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*'
		bah copy "$c" "$goroot" /usr/local/go
		# This machine's CA bundle, so the build reaches the module proxy
		# through whatever TLS this machine trusts.
		[ -f /etc/ssl/certs/ca-certificates.crt ] && bah copy "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
		bah config --env GOPATH=/go --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			--annotation "kiln.stamp=$stamp" "$c"
		bah commit --quiet --rm "$c" "$build_base" >/dev/null
	fi
	args+=(--build-arg "BUILD_IMAGE=$build_base" --build-arg "BASE_IMAGE=$base")
fi
if [ -n "$go_cache" ]; then
	args+=(-v "$(go env GOMODCACHE):/go/pkg/mod" -v "$(go env GOCACHE):/root/.cache/go-build")
fi
if [ -n "${GOPROXY:-}" ] || command -v go >/dev/null; then
	args+=(--build-arg "GOPROXY=${GOPROXY:-$(go env GOPROXY)}")
fi

for t in "${targets[@]}"; do
	echo "docker/build.sh: building $prefix-$t" >&2
	bah build --quiet --isolation chroot --layers -f docker/Dockerfile --target "$t" -t "$prefix-$t" "${args[@]}" . >/dev/null
	echo "$prefix-$t"
done
