#!/usr/bin/env bash
# docker/smoke.sh: start kiln's images together without a container engine
# and run a build, an upload and a timing through them.
#
#   docker/smoke.sh [--prefix NAME] [--keep DIR]
#
# Each image (PREFIX-tracker, PREFIX-compiler, PREFIX-device-cpu, as
# docker/build.sh names them) is unpacked with umoci and its entrypoint run,
# as the image's user, in a chroot of its root filesystem under
# `unshare --mount --pid --fork` (its own mount and PID namespaces, /proc,
# /dev and /tmp of its own), on loopback ports with a fresh token. The client
# is the kiln binary of the tracker image, run on this machine: it builds the
# demo's matmul through the tracker (the compiler image builds it), then runs
# it on the device image through a lease, checks the product with numpy, and
# times it there. Needs root, buildah,
# umoci, unshare and chroot; prints every daemon's log when a step fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

prefix="localhost/kiln" keep=""
while [ $# -gt 0 ]; do
	case "$1" in
	--prefix) prefix="$2"; shift ;;
	--keep) keep="$2"; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "docker/smoke.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done
[ "$(id -u)" = 0 ] || { echo "docker/smoke.sh: needs root (chroot and namespaces)" >&2; exit 1; }
for tool in buildah umoci unshare chroot; do
	command -v "$tool" >/dev/null || { echo "docker/smoke.sh: $tool is not installed" >&2; exit 1; }
done
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
bah() { buildah --storage-driver "$STORAGE_DRIVER" "$@"; }

work="$(mktemp -d)"
pids=()
cleanup() {
	# unshare ignores SIGTERM while it waits: stop each daemon (the
	# namespace's first process) itself, then unshare, whose --kill-child
	# takes the rest of the namespace with it.
	for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null || true; done
	sleep 1
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$keep" ]; then
		rm -rf "$keep" && mv "$work" "$keep"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
logs() {
	for f in "$work"/*.log; do
		echo "--- $f" >&2
		tail -n 40 "$f" >&2
	done
}
fail() {
	echo "docker/smoke.sh: $*" >&2
	logs
	exit 1
}

# A python3 with numpy, to make the inputs and check the product.
py=python3
if ! "$py" -c 'import numpy' 2>/dev/null && [ -x /usr/bin/python3 ]; then
	py=/usr/bin/python3
fi
"$py" -c 'import numpy' 2>/dev/null || { echo "docker/smoke.sh: needs python3 with numpy (Debian: apt-get install python3-numpy)" >&2; exit 1; }

# A free loopback port: bind 0, read the port, release it.
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"

# unpack TARGET: the image's root filesystem under $work/TARGET/rootfs.
unpack() {
	local t="$1"
	bah push --quiet "$prefix-$t" "oci:$work/oci:$t" >/dev/null
	umoci unpack --image "$work/oci:$t" "$work/$t" >/dev/null
	mkdir -p "$work/$t/rootfs/run/kiln"
	cp "$work/token" "$work/$t/rootfs/run/kiln/token"
}

# start TARGET ARGS...: the image's entrypoint followed by ARGS, as the
# image's user, in a chroot with its own mount and PID namespaces.
start() {
	local t="$1"; shift
	local root="$work/$t/rootfs"
	local user uid gid home entry env
	# The image's user, entrypoint and environment, one per line.
	{ read -r user; read -r entry; read -r env; } <<< "$(bah inspect --type image --format \
		'{{.OCIv1.Config.User}}{{"\n"}}{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}{{"\n"}}{{range .OCIv1.Config.Env}}{{.}} {{end}}' "$prefix-$t")"
	read -r uid gid home <<< "$(awk -F: -v u="${user:-root}" '$1 == u { print $3, $4, $6 }' "$root/etc/passwd")"
	[ -n "$uid" ] || fail "image $prefix-$t: user ${user:-root} is not in its /etc/passwd"
	chown "$uid:$gid" "$root/run/kiln/token"
	chmod 0400 "$root/run/kiln/token"
	[ ! -d "$root/data" ] || chown "$uid:$gid" "$root/data"
	[ -n "$entry" ] || fail "image $prefix-$t has no entrypoint"
	# The environment a container engine gives: the image's ($env), and
	# HOME from the user's passwd entry; nothing of this shell's.
	# shellcheck disable=SC2086 # the entrypoint's words are split on purpose
	unshare --mount --pid --fork --kill-child -- sh -c '
		root="$1" userspec="$2"; shift 2
		mount --make-rprivate /
		mount -t proc proc "$root/proc"
		mount --rbind /dev "$root/dev"
		mount -t tmpfs tmpfs "$root/tmp"
		exec chroot --userspec="$userspec" "$root" "$@"
	' sh "$root" "$uid:$gid" env -i "HOME=${home:-/}" $env $entry "$@" > "$work/$t.log" 2>&1 &
	pids+=($!)
}

for t in tracker compiler device-cpu; do
	unpack "$t"
done
kiln="$work/tracker/rootfs/usr/local/bin/kiln"
tracker_port="$(free_port)" tvm_port="$(free_port)" metrics_port="$(free_port)"
device_port="$(free_port)" device_metrics_port="$(free_port)"
tracker="127.0.0.1:$tracker_port"

# Later flags override the entrypoint's 0.0.0.0 listeners: loopback only.
start tracker --listen "$tracker" --tvm-listen "127.0.0.1:$tvm_port" --metrics-listen "127.0.0.1:$metrics_port" --token-file /run/kiln/token
start compiler --tracker "$tracker" --token-file /run/kiln/token
start device-cpu --listen "127.0.0.1:$device_port" --metrics-listen "127.0.0.1:$device_metrics_port" \
	--tracker "$tracker" --key cpu --token-file /run/kiln/token

export KILN_TOKEN_FILE="$work/token"
for _ in $(seq 150); do
	"$kiln" query --tracker "$tracker" 2>/dev/null | grep -q 'cpu' && break
	sleep 0.2
done
"$kiln" query --tracker "$tracker" > "$work/query.out" 2>&1 || fail "kiln query: $(cat "$work/query.out")"
grep -q cpu "$work/query.out" || fail "the device image never registered: $(cat "$work/query.out")"

cd "$work"
"$kiln" demo --size 32 --keep demo > demo.out 2>&1 || fail "kiln demo: $(cat demo.out)"
"$kiln" build demo/matmul.py --tracker "$tracker" -o remote.kiln > build.out 2>&1 || fail "remote build: $(cat build.out)"
"$py" -c "import numpy as np; r = np.random.default_rng(0); np.save('a.npy', r.random((64, 64), dtype=np.float32)); np.save('b.npy', r.random((64, 64), dtype=np.float32))"
inputs=(--input A=a.npy --input B=b.npy)
"$kiln" run remote.kiln --func matrix_multiply --tracker "$tracker" --key cpu --wait 30s "${inputs[@]}" --output out/ > run.out 2>&1 ||
	fail "remote run: $(cat run.out)"
"$py" -c "
import glob, numpy as np
out = np.load(glob.glob('out/*.npy')[0])
want = np.load('a.npy') @ np.load('b.npy')
assert np.allclose(out, want, rtol=1e-4, atol=1e-4), abs(out - want).max()
" > check.out 2>&1 || fail "the device image computed a wrong product: $(cat check.out)"
"$kiln" bench remote.kiln --func matrix_multiply --tracker "$tracker" --key cpu --wait 30s "${inputs[@]}" --repeat 3 --json > bench.json 2> bench.err ||
	fail "remote bench: $(cat bench.err)"
grep -q '"median"' bench.json || fail "remote bench printed no timing: $(cat bench.json)"
"$py" - "$metrics_port" "$device_metrics_port" <<'EOF' || fail "the tracker's or the device's metrics listener does not serve /metrics, /healthz and /readyz"
import sys, urllib.request
def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%s%s" % (port, path), timeout=5) as r:
        return r.status, r.read().decode()
for port in sys.argv[1:]:
    status, body = get(port, "/metrics")
    assert status == 200 and any(l.startswith("kiln_") for l in body.splitlines()), (port, "/metrics", status)
    for path in ("/healthz", "/readyz"):
        status, body = get(port, path)
        assert status == 200, (port, path, status, body)
EOF
[ -x "$work/device-cpu/rootfs/usr/bin/bwrap" ] || fail "the device-cpu image lacks bubblewrap (/usr/bin/bwrap)"
echo "docker/smoke.sh: tracker, compiler and device-cpu images built, uploaded, ran and timed matrix_multiply: $(cat bench.json)"
