#!/bin/bash
# ftcluster run gpt-2n: 2 rank(s) as process groups on this machine
# (generated; run it directly: bash job.sh). Rank r serves HTTP on 18000 + r*10.
# Values are shell-quoted data; the shared variable block defines some this script does not use.
# shellcheck disable=SC2016,SC2034,SC2089,SC2090
set -uo pipefail
RUN_ID=gpt-2n
RUN_DIR=/shared/runs/gpt-2n
REPO=/shared/runs/gpt-2n/model_repository
LOGS=/shared/runs/gpt-2n/logs
STATE=/shared/runs/gpt-2n/state
RESULTS=/shared/runs/gpt-2n/results
SCRIPTS=/shared/runs/gpt-2n/scripts
NODES=2
HTTP_PORT=18000
PORT_STRIDE=10
SERVED_MODEL=ensemble
ID_PREFIX=ftc-gpt-2n
PY=/opt/ftcluster/venv/bin/python
TRITON=/opt/tritonserver/bin/tritonserver
READY_TIMEOUT=120
EXIT_GRACE=20
KEEP_SERVING=0
RUN_CLIENT=1
CLIENT_ARGS=(--protocol http --batch-size 2 --input-len 8 --output-len 8)
export RUN_ID RUN_DIR REPO LOGS STATE ID_PREFIX PORT_STRIDE
mkdir -p "$LOGS" "$STATE" "$RESULTS"

# One line per milestone; `ftcluster launch/status` follow this file.
event() { printf '%s %s\n' "$(date +%s.%N)" "$*" >>"$STATE/events"; }

# The first rank that exited (before the client was done), or nothing.
first_exited_rank() {
  local f
  for f in "$STATE"/rank*.exit; do
    [ -e "$f" ] || continue
    f=${f##*/rank}
    printf '%s\n' "${f%.exit}"
    return 0
  done
  return 1
}

fail() {
  local rank node why="$*"
  if rank=$(first_exited_rank); then
    node=$(cat "$STATE/rank$rank.host" 2>/dev/null || echo '?')
    event "rank_failed $rank $node $(cat "$STATE/rank$rank.exit")"
    # A cause the rank named itself (a port in use) says more than its exit.
    if [ -s "$STATE/rank$rank.problem" ]; then why="$(cat "$STATE/rank$rank.problem") (rank $rank)"; fi
    echo "ftcluster: rank $rank on $node exited during start-up; last lines of its log:" >&2
    tail -n 20 "$LOGS/server-rank$rank.log" "$LOGS/rank$rank.stdout" >&2 2>/dev/null || true
  fi
  event "failed $why"
  echo "ftcluster: $why" >&2
  exit 1
}

check_servers() {
  if first_exited_rank >/dev/null; then fail "a server rank exited"; fi
  servers_alive || fail "the server step ended"
  if (( SECONDS >= READY_DEADLINE )); then fail "rank 0 not ready after ${READY_TIMEOUT}s (server.ready_timeout)"; fi
}

# GET http://HOST:PORT/PATH through bash's /dev/tcp: no process per poll, so readiness is seen
# within a few ms. Sets HTTP_BODY; status 0 only for HTTP 200.
http_get() {
  local fd line
  HTTP_BODY=
  exec {fd}<>"/dev/tcp/$1/$2" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&"$fd"
  if ! IFS= read -r -t 2 line <&"$fd" || [[ $line != "HTTP/1."?" 200"* ]]; then
    exec {fd}>&-
    return 1
  fi
  while IFS= read -r -t 2 line <&"$fd" && [ "${line%$'\r'}" != "" ]; do :; done
  IFS= read -r -d '' -t 2 HTTP_BODY <&"$fd"
  exec {fd}>&-
  return 0
}

# A rank's server is up when it answers /v2/health/ready and /v2 names OUR --id (not a stale
# server on the port).
rank_up() {
  local host=$1 port=$2 id=$3
  http_get "$host" "$port" /v2/health/ready 2>/dev/null \
    && http_get "$host" "$port" /v2 2>/dev/null \
    && [[ $HTTP_BODY == *"\"name\":\"$id\""* ]]
}

# Ready = rank 0 is up with the served model ready, then every other rank is up too; every
# rank must stay alive meanwhile.
wait_ready() {
  READY_DEADLINE=$((SECONDS + READY_TIMEOUT))
  while [ ! -s "$STATE/rank0.host" ]; do check_servers; sleep 0.05; done
  RANK0_HOST=$(cat "$STATE/rank0.host")
  RANK0_URL="$RANK0_HOST:$HTTP_PORT"
  event "servers_starting $RANK0_HOST"
  until rank_up "$RANK0_HOST" "$HTTP_PORT" "$ID_PREFIX-rank0" \
    && http_get "$RANK0_HOST" "$HTTP_PORT" "/v2/models/$SERVED_MODEL/ready" 2>/dev/null; do
    check_servers
    sleep 0.01
  done
  local r host
  for ((r = 1; r < NODES; r++)); do
    until [ -s "$STATE/rank$r.host" ] && host=$(cat "$STATE/rank$r.host") \
      && rank_up "$host" "$((HTTP_PORT + r * PORT_STRIDE))" "$ID_PREFIX-rank$r"; do
      check_servers
      sleep 0.01
    done
  done
  check_servers
  event "ready $RANK0_URL"
}

run_client() {
  event "client_started"
  local rc=0
  on_rank0 "$PY" -m ftcluster.client identity --url "$RANK0_URL" --model "$SERVED_MODEL" \
    "${CLIENT_ARGS[@]}" --result-file "$RESULTS/client.json" >"$LOGS/client.log" 2>&1 || rc=$?
  event "client_done $rc"
  return "$rc"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_servers
  event "done $rc"
  exit "$rc"
}

RANK_PIDS=()
servers_alive() {
  local pid
  for pid in "${RANK_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done
}
stop_servers() {
  local pid waited=0
  for pid in "${RANK_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  while servers_alive_any && (( waited < EXIT_GRACE * 10 )); do sleep 0.1; waited=$((waited + 1)); done
  for pid in "${RANK_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  event "servers_stopped"
}
servers_alive_any() {
  local pid
  for pid in "${RANK_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
on_rank0() { "$@"; }

trap cleanup EXIT
trap 'event "interrupted"; exit 130' INT TERM
event "job_started $(hostname) $$"
for ((r = 0; r < NODES; r++)); do
  FTC_RANK=$r FTC_WORLD_SIZE=$NODES FTC_LOCAL_RANK=0 FTC_RANK_HOST=127.0.0.1 \
    setsid bash "$SCRIPTS/rank_server.sh" >"$LOGS/rank$r.stdout" 2>&1 &
  RANK_PIDS+=("$!")
done
wait_ready
if (( RUN_CLIENT )); then run_client || exit $?; fi
if (( KEEP_SERVING )); then
  event "serving $RANK0_URL"
  while servers_alive; do sleep 1; done
  fail "a server rank exited while serving"
fi
