#!/usr/bin/env bash
# Re-records the golden recordings from the lab, scenario by scenario, and
# writes each one's expected `dnstrace replay -o json` output next to it.
#
#   export CARGO_TARGET_DIR=... && cargo build --release -p dnstrace
#   flock -o /run/dnstrace-lab.lock tests/golden/record.sh [SCENARIO...]
#
# Root, and the lab lock: the lab's namespaces have fixed names.
# Without arguments every scenario is recorded. DNSTRACE_BIN overrides the
# binary ($CARGO_TARGET_DIR/release/dnstrace, else target/release/dnstrace).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${DNSTRACE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dnstrace}
WEB=dtlab-web-7d9f8c6b5-x2x4k
SERVICE=10.96.0.10
KUBERNETES=kubernetes.default.svc.cluster.local.
WORK=$(mktemp -d)
TRACE_PID=

cleanup() {
    [ -n "$TRACE_PID" ] && kill -INT "$TRACE_PID" 2>/dev/null || true
    "$BIN" lab down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

lab() { "$BIN" lab "$@"; }

# dig from the web pod: one try, a short timeout, whatever it gets.
dig_web() { ip netns exec "$WEB" dig +tries=1 +time=2 "$@" >/dev/null || true; }

# A fresh lab with `lab up` ARGS.
fresh_lab() {
    lab down >/dev/null 2>&1 || true
    lab up "$@" >/dev/null
}

# Starts tracing the whole lab node into NAME.pcapng, with extra ARGS;
# returns once it captures.
start_trace() {
    local name=$1
    shift
    rm -f "$HERE/$name.pcapng"
    "$BIN" trace -o json --timeout 3s --sample 1 \
        --node-netns /run/netns/dtlab-node \
        --containerd-root /run/dnstrace-lab/containerd \
        --record "$HERE/$name.pcapng" "$@" >"$WORK/$name.live" 2>"$WORK/$name.err" &
    TRACE_PID=$!
    for _ in $(seq 200); do
        grep -qs "capturing DNS" "$WORK/$name.err" && return
        sleep 0.1
    done
    cat "$WORK/$name.err" >&2
    exit 1
}

# Lets the last journeys end (past --timeout), stops the trace and writes
# the expectation.
stop_trace() {
    local name=$1
    sleep 4
    kill -INT "$TRACE_PID"
    wait "$TRACE_PID"
    TRACE_PID=
    # The recording is the owner's only; the tests replay it as anyone.
    chmod 644 "$HERE/$name.pcapng"
    "$BIN" replay "$HERE/$name.pcapng" -o json >"$HERE/$name.jsonl"
    echo "$name: $(stat -c %s "$HERE/$name.pcapng") bytes," \
        "kinds: $(grep -o '"kind":"[a-z_]*"' "$HERE/$name.jsonl" | sort -u | cut -d'"' -f4 | tr '\n' ' ')"
}

# UDP and TCP lookups, a truncated answer retried over TCP, an answer in
# IP fragments: nothing to raise.
healthy() {
    fresh_lab
    start_trace healthy
    dig_web @$SERVICE +tcp $KUBERNETES
    dig_web @$SERVICE +bufsize=1232 big.example.com TXT
    dig_web @$SERVICE +bufsize=4096 huge.example.com TXT
    lab traffic --pod web --name $KUBERNETES >/dev/null
    stop_trace healthy
}

bridge_nf_off() {
    fresh_lab --fault bridge-nf-off
    start_trace bridge-nf-off
    dig_web @$SERVICE $KUBERNETES
    stop_trace bridge-nf-off
}

no_dnat() {
    fresh_lab --fault no-dnat
    start_trace no-dnat
    dig_web @$SERVICE $KUBERNETES
    stop_trace no-dnat
}

forward_loop() {
    fresh_lab --fault forward-loop
    start_trace forward-loop
    dig_web @10.244.0.53 loop.example.com
    stop_trace forward-loop
}

# dig +ignore keeps the truncated answer, as a client without TCP fallback.
truncated() {
    fresh_lab
    start_trace truncated
    dig_web @$SERVICE big.example.com TXT +ignore
    stop_trace truncated
}

upstream_timeout() {
    fresh_lab --fault upstream-timeout
    start_trace upstream-timeout
    dig_web @$SERVICE ut.example.com
    # A stub's A and AAAA, and its retry: CoreDNS forwards each, and the
    # upstream drops them all.
    lab traffic --pod web --name ut2.example.com. >/dev/null
    stop_trace upstream-timeout
}

# Both CoreDNS pods stopped (SIGSTOP) while a query reaches one: nothing
# answers or forwards it. They go on once the trace has stopped, so that
# their late answer is not in the recording.
stalled_resolver() {
    fresh_lab
    local pids
    pids=$(for pod in coredns-7db6d8ff4d-4xk9m coredns-7db6d8ff4d-vz8lp; do
        ip netns pids "dtlab-$pod"
    done)
    start_trace stalled-resolver
    kill -STOP $pids
    dig_web @$SERVICE stalled.example.com
    stop_trace stalled-resolver
    kill -CONT $pids
}

servfail() {
    fresh_lab --fault servfail
    start_trace servfail
    dig_web @$SERVICE sf.example.com
    stop_trace servfail
}

# Traced for the web pod, whose resolv.conf searches corp.example.com: its
# search-list misses go upstream, where every answer is slow. Three names
# over ten seconds, none of them cached: amplification is a habit, not one
# lookup.
slow_search_leak() {
    fresh_lab --fault search-leak --fault slow-upstream
    start_trace slow-search-leak --pod web
    for name in www api chain; do
        [ "$name" = www ] || sleep 5
        lab traffic --pod web --name "$name.example.com" >/dev/null
    done
    stop_trace slow-search-leak
}

# A and AAAA from one socket: when one is sent to the CoreDNS pod the
# firewall drops and the other to the other pod, one of the pair is lost.
drop() {
    fresh_lab --fault drop
    start_trace drop
    for _ in $(seq 6); do
        lab traffic --pod web --name $KUBERNETES >/dev/null
    done
    stop_trace drop
}

# Traced for the web pod, whose resolv.conf names 127.0.0.53.
loopback_nameserver() {
    fresh_lab --fault loopback-nameserver
    start_trace loopback-nameserver --pod web
    lab traffic --pod web --name $KUBERNETES >/dev/null
    stop_trace loopback-nameserver
}

no_dns_tcp() {
    fresh_lab --fault no-dns-tcp
    start_trace no-dns-tcp
    dig_web @$SERVICE +bufsize=1232 big.example.com TXT
    stop_trace no-dns-tcp
}

# Cached in both CoreDNS pods first, so that what is lost is their answer.
fragments_dropped() {
    fresh_lab
    dig_web @10.244.0.53 +bufsize=4096 huge.example.com TXT
    dig_web @10.244.0.54 +bufsize=4096 huge.example.com TXT
    lab fault fragments-dropped on >/dev/null
    start_trace fragments-dropped
    dig_web @$SERVICE +bufsize=4096 huge.example.com TXT
    stop_trace fragments-dropped
}

ALL=(healthy bridge-nf-off no-dnat forward-loop truncated upstream-timeout
    stalled-resolver servfail slow-search-leak drop loopback-nameserver
    no-dns-tcp fragments-dropped)
for scenario in "${@:-${ALL[@]}}"; do
    "${scenario//-/_}"
done
