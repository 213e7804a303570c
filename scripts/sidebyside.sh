#!/usr/bin/env bash
# sidebyside.sh measures this checkout's Coordinator (A) against MarbleRun's
# no-enclave Coordinator (B) with quarry-bench, on the same machine, the
# same manifests and the same load: Marble activations over kept
# connections, with a new connection per activation (full handshakes), with
# a new connection that resumes its TLS session, concurrent secret
# uploads by several users, and the time of setting a first manifest with a
# few secrets (SET_SECRETS, each on SETS fresh Coordinators per round; the
# default mix without RSA keys, whose generation is the same Go code in both
# and varies tenfold from key to key). A second copy of A (A2, the same binary) runs as
# well: the A/A difference is the noise of the machine. A, B and A2 run
# interleaved, ROUNDS times, in an order that turns every round; the script
# prints every figure and the medians.
#
# MarbleRun is built in a temporary directory from its source in the Go
# module cache (downloaded with `go mod download` if missing), as its CMake
# target coordinator-noenclave builds it (GOFIPS140=latest, -trimpath); the
# repository itself does not depend on MarbleRun. MR_BIN=path skips that
# build. Needs go, curl and python3.
#
#   scripts/sidebyside.sh                  # 3 rounds of 10 s per figure, ~10 min
#   ROUNDS=1 DURATION=5s scripts/sidebyside.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
MARBLES=${MARBLES:-32}
USERS=${USERS:-32}
# PIN=1 runs each Coordinator on CPU 0 and quarry-bench on the others
# (taskset), so that a rate is the Coordinator's own capacity rather than
# what the two share; needs 2 CPUs or more.
PIN=${PIN:-0}
MR_VERSION=${MR_VERSION:-v1.9.1}
# PARTS chooses what runs: activate, upload and set-manifest.
PARTS=${PARTS:-activate upload set-manifest}
SET_SECRETS=${SET_SECRETS:-10 100}
SETS=${SETS:-5}
SET_MIX=${SET_MIX:-rsa=0,ecdsa=20,ed25519=10,symmetric=10}

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "building A (this checkout) in $work" >&2
go build -C "$repo" -o "$work/quarry" ./cmd/coordinator
go build -C "$repo" -o "$work/bench" ./cmd/quarry-bench
mr=${MR_BIN:-}
if [ -z "$mr" ]; then
	src="$(go env GOMODCACHE)/github.com/edgelesssys/marblerun@$MR_VERSION"
	if [ ! -d "$src" ]; then
		(cd "$work" && GOFLAGS=-mod=mod go mod download "github.com/edgelesssys/marblerun@$MR_VERSION")
	fi
	echo "building B (MarbleRun $MR_VERSION, coordinator-noenclave) in $work/mr" >&2
	cp -r "$src" "$work/mr"
	chmod -R u+w "$work/mr"
	(cd "$work/mr" && GOFIPS140=latest go build -trimpath -buildvcs=false -o "$work/marblerun" ./cmd/coordinator)
	mr="$work/marblerun"
fi
"$work/bench" -print-manifest bench-shared >"$work/activate.json"

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start BINARY: a fresh Coordinator on free loopback ports; sets pid, addr
# and mesh. Quarry's per-source limits are raised as quarry-bench does for
# the Coordinators it starts (all load comes from 127.0.0.1).
start() {
	local dir client meshport
	dir=$(mktemp -d -p "$work")
	mkdir "$dir/seal"
	client=$(freeport)
	meshport=$(freeport)
	EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:$client EDG_COORDINATOR_MESH_ADDR=127.0.0.1:$meshport \
		EDG_COORDINATOR_SEAL_DIR=$dir/seal EDG_COORDINATOR_DNS_NAMES=localhost,127.0.0.1 \
		QUARRY_CLIENT_MAX_PER_SOURCE=1000000 QUARRY_MESH_MAX_CONNECTIONS=65536 QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE=65536 \
		"${coordpin[@]}" "$1" >"$dir/log" 2>&1 &
	pid=$!
	addr=127.0.0.1:$client
	mesh=127.0.0.1:$meshport
	for _ in $(seq 300); do
		if curl -sfk "https://$addr/api/v2/status" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	echo "$1 did not start; its log:" >&2
	cat "$dir/log" >&2
	exit 1
}

stop() {
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	pid=""
}

# rate: quarry-bench's JSON report on stdin → requests/s of its scenario,
# or "failed" when it had errors.
rate() {
	python3 -c 'import json, sys
s = json.load(sys.stdin)["scenarios"][0]
print("failed" if s.get("errors") or s.get("non2xx") else round(s["requestsPerSecond"], 1))'
}

# requests: the number of requests in quarry-bench's JSON report on stdin.
requests() {
	python3 -c 'import json, sys
print(json.load(sys.stdin)["scenarios"][0]["requests"])'
}

# cputicks: the Coordinator's CPU time so far (user and system), in clock
# ticks.
cputicks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

# settime: quarry-bench's set-manifest report on stdin → the POST's time in
# ms, or "failed".
settime() {
	python3 -c 'import json, sys
s = json.load(sys.stdin)["scenarios"][0]
print("failed" if s.get("skipped") or s.get("errors") or s.get("non2xx") else round(s["medianSeconds"] * 1000, 3))'
}

# median: the median of the numbers on stdin ("failed" when one failed).
median() {
	python3 -c 'import statistics, sys
xs = sys.stdin.read().split()
print("failed" if "failed" in xs or not xs else statistics.median(float(x) for x in xs))'
}

part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

coordpin=() benchpin=()
if [ "$PIN" = 1 ]; then
	coordpin=(taskset -c 0)
	benchpin=(taskset -c "1-$(($(nproc) - 1))")
fi

results="$work/results"
: >"$results"
# The order of A, B and A2 turns with every round: whatever the position in
# a round costs (the first after a pause, the last before one) falls on
# each of them in turn.
orders=("A B A2" "B A2 A" "A2 A B")
for round in $(seq "$ROUNDS"); do
	for variant in ${orders[$(((round - 1) % 3))]}; do
		bin="$work/quarry"
		[ "$variant" = B ] && bin="$mr"
		if part activate; then
			start "$bin"
			curl -sfk --data-binary "@$work/activate.json" "https://$addr/manifest" >/dev/null
			# -p256: the Marbles' TLS keys are P-256, as Quarry's runtime makes
			# them (without: P-384, as MarbleRun's premain makes them).
			for mode in kept reconnect resume kept-p256 reconnect-p256; do
				flags=()
				case "$mode" in
				reconnect*) flags=(-activate-reconnect) ;;
				resume) flags=(-activate-reconnect -activate-resume) ;;
				esac
				[ "${mode%-p256}" != "$mode" ] && flags+=(-activate-key p256)
				c0=$(cputicks)
				"${benchpin[@]}" "$work/bench" -mesh-addr "$mesh" -marble-type bench-shared -c "$MARBLES" -d "$DURATION" "${flags[@]}" -json 2>/dev/null >"$work/report.json" || true
				c1=$(cputicks)
				r=$(rate <"$work/report.json")
				echo "$round $variant activate-$mode $r" | tee -a "$results"
				# The Coordinator's own CPU per activation, in ms: its
				# capacity, whatever the load generator on the same cores
				# costs.
				n=$(requests <"$work/report.json")
				[ "$r" != failed ] && [ "$n" -gt 0 ] && r=$(python3 -c "print(round(($c1 - $c0) * 1000 / $hz / $n, 3))")
				echo "$round $variant activate-$mode-cpu-ms $r" | tee -a "$results"
			done
			stop
		fi
		if part upload; then
			start "$bin"
			r=$("${benchpin[@]}" "$work/bench" -addr "$addr" -insecure -scenarios upload-concurrent -c "$USERS" -d "$DURATION" -json 2>/dev/null | rate)
			echo "$round $variant upload-concurrent $r" | tee -a "$results"
			stop
		fi
		part set-manifest || continue
		# set-manifest: the median of SETS fresh Coordinators, in ms.
		for n in $SET_SECRETS; do
			times=()
			for _ in $(seq "$SETS"); do
				start "$bin"
				times+=("$("${benchpin[@]}" "$work/bench" -addr "$addr" -insecure -scenarios set-manifest -secrets "$n" -mix "$SET_MIX" -json 2>/dev/null | settime)")
				stop
			done
			echo "$round $variant set-manifest-$n-ms $(printf '%s\n' "${times[@]}" | median)" | tee -a "$results"
		done
	done
done

echo
echo "medians of $ROUNDS rounds, per second (-cpu-ms: the Coordinator's CPU per activation, ms), set-manifest in ms ($MARBLES Marbles, $USERS users, $DURATION each; $SETS fresh Coordinators per set-manifest figure; $(nproc) CPUs; PIN=$PIN):"
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def med(v, s):
    xs = [float(r[3]) for r in rows if r[1] == v and r[2] == s and r[3] != "failed"]
    return statistics.median(xs) if xs else float("nan")
print(f"{'scenario':24} {'A':>9} {'B':>9} {'A2':>9} {'A/B':>6} {'A2/A':>6}")
for s in dict.fromkeys(r[2] for r in rows):
    a, b, a2 = med("A", s), med("B", s), med("A2", s)
    print(f"{s:24} {a:9.1f} {b:9.1f} {a2:9.1f} {a/b:6.2f} {a2/a:6.2f}")
PY
