#!/bin/bash
# User-space instructions per keep-alive GET through lameduck, counted by valgrind's callgrind:
# steady where CPU time is not (a shared machine moves bench/run.py's CPU µs/request by
# tens of percent between runs; instruction counts by a few percent). Kernel time (the
# socket calls, about half of the bench's CPU per request) is not counted.
#
#   bench/instructions.sh [--log] [--json] [--h2] [--nginx] [--h2-upstream] [--tls] [SECONDS]
#
# From the repository (its .venv's python, or PYTHON=...; PYTHONPATH=src to measure a clone).
#
# --log: the listener's access log on (Envoy's default format, to a file), as bench/run.py's
# lameduck-log. lameduck runs under callgrind on CPU 0, the demo origin and wrk -c10 on CPU 1;
# the counters are zeroed after a warm-up and dumped after SECONDS (8) of load, and the requests
# in between are read from the admin's stats. Every process started is stopped by pid. --json:
# the access log on with `format: json` (implies --log).
# --h2: h2c prior-knowledge clients (h2load -c5 -m10) instead of wrk's HTTP/1.1 ones, to the same
# HTTP/1.1 origin. --nginx: an nginx origin (one process, `return 200` with the demo origin's
# body) instead of the demo one: its responses carry Connection: keep-alive, Date and Server, as
# real origins' do (the demo origin sends no Connection field). CG_OUT=FILE keeps callgrind's
# dump there, for callgrind_annotate (where the instructions go). --tls: the listener speaks TLS
# (a self-signed P-256 certificate made by openssl in the temp dir, ALPN http/1.1) and wrk
# sends https keep-alive: one wrk for warm-up (10 s) and measurement, so that the connections'
# handshakes are made before the counters are zeroed: what TLS records cost per request,
# OpenSSL's own instructions included. --h2-upstream: the cluster speaks HTTP/2 (h2c prior
# knowledge, `protocol: h2`) to an nginx origin that listens with `http2` (implies --nginx):
# every request is a stream on the connections lameduck shares to it.
set -euo pipefail
LOG=0
JSON=0
H2=0
NGINX=0
TLS=0
H2UP=0
while [ "${1:-}" = --log ] || [ "${1:-}" = --json ] || [ "${1:-}" = --h2 ] || [ "${1:-}" = --nginx ] ||
      [ "${1:-}" = --tls ] || [ "${1:-}" = --h2-upstream ]; do
  [ "$1" = --tls ] && TLS=1
  [ "$1" = --h2-upstream ] && H2UP=1 && NGINX=1
  [ "$1" = --log ] && LOG=1
  [ "$1" = --json ] && LOG=1 && JSON=1
  [ "$1" = --h2 ] && H2=1
  [ "$1" = --nginx ] && NGINX=1
  shift
done
SECS=${1:-8}
[ $# -le 1 ] || {
  echo "usage: bench/instructions.sh [--log] [--json] [--h2] [--nginx] [--h2-upstream] [--tls] [SECONDS]" >&2
  exit 2; }
if [ "$TLS" = 1 ] && [ "$H2" = 1 ]; then
  echo "--tls is measured with wrk (HTTP/1.1 over TLS), not with --h2" >&2; exit 2
fi
if [ "$H2" = 1 ] && ! command -v h2load > /dev/null; then
  echo "--h2 needs h2load (Debian package nghttp2-client)" >&2; exit 2
fi
if [ "$NGINX" = 1 ] && ! command -v nginx > /dev/null; then
  echo "--nginx needs nginx (Debian package nginx-light)" >&2; exit 2
fi
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$PY" ] || PY=python3
W=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$NGINX" = 1 ]; then
  ORIGIN=$(free_port)
  mkdir "$W/nginx"
  # One process, no logs, every temp path in $W (as bench/run.py's nginx origin).
  cat > "$W/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $W/nginx/client_body;
    proxy_temp_path $W/nginx/proxy;
    fastcgi_temp_path $W/nginx/fastcgi;
    uwsgi_temp_path $W/nginx/uwsgi;
    scgi_temp_path $W/nginx/scgi;
    default_type text/plain;
    keepalive_timeout 60s;
    keepalive_requests 100000000;
    server {
        listen 127.0.0.1:$ORIGIN$([ "$H2UP" = 1 ] && echo " http2");
        location / { return 200 "hello from the lameduck demo origin\\n"; }
    }
}
EOF
  taskset -c 1 nginx -p "$W/nginx" -e "$W/nginx/error.log" -c "$W/nginx/nginx.conf" \
    > "$W/origin.log" 2>&1 &
  PIDS+=($!)
  CURL_ORIGIN=(curl -sf -o /dev/null -m 1)
  [ "$H2UP" = 1 ] && CURL_ORIGIN+=(--http2-prior-knowledge)
  for _ in $(seq 100); do
    "${CURL_ORIGIN[@]}" "http://127.0.0.1:$ORIGIN/" && break
    sleep 0.1
  done
  "${CURL_ORIGIN[@]}" "http://127.0.0.1:$ORIGIN/" || {
    echo "the nginx origin did not start:" >&2; cat "$W/origin.log" "$W/nginx/error.log" >&2
    exit 1; }
else
  taskset -c 1 "$PY" -m lameduck.demo --port 0 > "$W/origin.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$W/origin.log" && break; sleep 0.1; done
  ORIGIN=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$W/origin.log" | cut -d: -f2 || true)
  [ -n "$ORIGIN" ] || { echo "the demo origin did not start ($PY):" >&2; cat "$W/origin.log" >&2; exit 1; }
fi
PORT=$(free_port)
ADMIN=$(free_port)
SCHEME=http
if [ "$TLS" = 1 ]; then
  SCHEME=https
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=127.0.0.1 -keyout "$W/key.pem" -out "$W/cert.pem" > /dev/null 2>&1
fi
{
  echo "admin: {address: 127.0.0.1:$ADMIN}"
  echo "drain: {time: 1s, strategy: gradual, connection_grace: 200ms}"
  echo "shutdown: {deadline: 2s, min_drain: 0s, stop_accepting: at_drain_end}"
  echo "listeners:"
  echo "  - {name: ingress, address: 127.0.0.1:$PORT, health_check_path: null, idle_timeout: 60s,"
  [ "$LOG" = 1 ] && echo "     access_log: {path: $W/access.log$([ "$JSON" = 1 ] && echo ", format: json")},"
  [ "$TLS" = 1 ] && echo "     tls: {certificate: $W/cert.pem, key: $W/key.pem, alpn: [http/1.1]},"
  echo "     routes: [{prefix: /, cluster: origin, timeout: 30s}]}"
  echo "clusters:"
  echo "  - {name: origin, endpoints: [127.0.0.1:$ORIGIN], connect_timeout: 5s,"
  echo "     max_idle_connections: 256, idle_timeout: 60s$([ "$H2UP" = 1 ] && echo ", protocol: h2")}"
} > "$W/lameduck.yaml"
taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" \
  "$PY" -m lameduck run -c "$W/lameduck.yaml" > "$W/lameduck.log" 2>&1 &
LD=$!
PIDS=("$LD" "${PIDS[@]}")
READY=0
for _ in $(seq 3000); do  # an upper bound (10 min: callgrind on a loaded machine), left at ready
  if curl -sf -o /dev/null -m 2 "http://127.0.0.1:$ADMIN/ready"; then READY=1; break; fi
  kill -0 "$LD" 2>/dev/null || break  # exited: no point waiting
  sleep 0.2
done
if [ "$READY" != 1 ]; then
  echo "lameduck (under callgrind) did not answer GET /ready with 200 on 127.0.0.1:$ADMIN;" \
    "tail of its log:" >&2
  tail -n 30 "$W/lameduck.log" >&2
  exit 1
fi
requests() { curl -s "http://127.0.0.1:$ADMIN/stats" | grep -o 'http.ingress.downstream_rq_total: [0-9]*' | grep -o '[0-9]*$'; }
load() {
  if [ "$H2" = 1 ]; then
    taskset -c 1 h2load -t1 -c5 -m10 -D "$1" "http://127.0.0.1:$PORT/" > /dev/null
  else
    taskset -c 1 wrk -t1 -c10 -d"${1}s" "$SCHEME://127.0.0.1:$PORT/" > /dev/null
  fi
}
if [ "$TLS" = 1 ]; then
  # One wrk for warm-up and measurement: a second one would open its connections again and
  # put their handshakes (millions of instructions each) in the count.
  taskset -c 1 wrk -t1 -c10 -d"$(( SECS + 30 ))s" "https://127.0.0.1:$PORT/" > /dev/null &
  WRK=$!
  PIDS=("$WRK" "${PIDS[@]}")
  sleep 10
  N0=$(requests || true)
  callgrind_control -z "$LD" > /dev/null 2>&1
  sleep "$SECS"
  callgrind_control -d "$LD" > /dev/null 2>&1
  N1=$(requests || true)
  kill "$WRK" 2>/dev/null || true
else
  load 3
  N0=$(requests || true)
  callgrind_control -z "$LD" > /dev/null 2>&1
  load "$SECS"
  callgrind_control -d "$LD" > /dev/null 2>&1
  N1=$(requests || true)
fi
N=$(( ${N1:-0} - ${N0:-0} ))
if [ -z "$N0" ] || [ -z "$N1" ] || [ "$N" -le 0 ]; then
  echo "no requests counted between the counter reset and the dump (downstream_rq_total" \
    "${N0:-unread} then ${N1:-unread}): is wrk working? tail of lameduck's log:" >&2
  tail -n 30 "$W/lameduck.log" >&2
  exit 1
fi
IR=$(grep -h -m1 '^summary:' "$W"/cg.out.* | awk '{print $2}')
echo "$([ "$TLS" = 1 ] && echo "TLS, ")$([ "$NGINX" = 1 ] && echo "nginx $([ "$H2UP" = 1 ] && echo "h2c ")origin, ")$([ "$H2" = 1 ] && echo "h2c 5x10, ")access log $([ "$LOG" = 1 ] && echo "on$([ "$JSON" = 1 ] && echo " (json)")" || echo off): $N requests, $IR instructions, $(( IR / N )) per request"
[ -z "${CG_OUT:-}" ] || cp "$W"/cg.out.1 "$CG_OUT"
