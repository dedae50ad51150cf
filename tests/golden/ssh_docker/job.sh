#!/bin/bash
# ftcluster run gpt-2n (generated): Docker on a plain host list. This script runs on the
# host where ftcluster runs; every node step reaches the nodes over ssh, at most
# node_ssh.parallel at once (python -m ftcluster.fanout, with scripts/nodes.json). One container
# per node, sshd inside on the run's port and key, then mpirun over ssh from rank 0's container.
# Every container of the run is removed at the end, whatever happens.
#   Start: setsid bash /shared/runs/gpt-2n/scripts/job.sh    Stop: kill -TERM -- -<its pid> (it tears down first)
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
HTTP_PORT=8000
PORT_STRIDE=0
SERVED_MODEL=ensemble
ID_PREFIX=ftc-gpt-2n
PY=/opt/ftcluster/venv/bin/python
TRITON=/opt/tritonserver/bin/tritonserver
READY_TIMEOUT=900
EXIT_GRACE=20
KEEP_SERVING=0
RUN_CLIENT=1
CLIENT_ARGS=(--protocol http --batch-size 2 --input-len 8 --output-len 8)
export RUN_ID RUN_DIR REPO LOGS STATE ID_PREFIX PORT_STRIDE
SSH_PORT=11068
SSH_DIR=/shared/runs/gpt-2n/state/ssh
LABEL=org.ftcluster.run
NODE_SCRIPT="$SCRIPTS/docker_node.sh"
LOCAL_PY=/opt/ftcluster/venv/bin/python
RUN_HOSTS=(dgx01 dgx02)
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

FANOUT=("$LOCAL_PY" -m ftcluster.fanout --config "$SCRIPTS/nodes.json")
# Every node at once (bounded), one output file per node as with srun --output=%N.
NODE_STEP=("${FANOUT[@]}" --hosts "$(IFS=,; echo "${RUN_HOSTS[*]}")")
# Rank 0's node is the first host.
NODE0=("${FANOUT[@]}" --hosts "${RUN_HOSTS[0]}" --)

find_hosts() {
  HOSTS=("${RUN_HOSTS[@]}")
  RANK0_NODE=${HOSTS[0]}
}

HOSTS=()
CONTAINERS=0
MPIRUN_PID=
FG_PID=
GUARD_PID=

# A foreground step the INT/TERM trap can interrupt (bash runs traps only between commands).
run_fg() {
  "$@" &
  FG_PID=$!
  wait "$FG_PID"
  local rc=$?
  FG_PID=
  return "$rc"
}

servers_alive() { [ -n "$MPIRUN_PID" ] && kill -0 "$MPIRUN_PID" 2>/dev/null; }
stop_servers() {
  servers_alive || return 0
  local waited=0
  # SIGTERM to each rank in its own container (mpirun's own forwarding does not reach the
  # remote ranks); mpirun ends when they have. The container removal below is the SIGKILL.
  timeout --kill-after=5 60 "${NODE_STEP[@]}" --output="$LOGS/docker-stop-%N.log" \
    bash "$NODE_SCRIPT" stop-ranks
  while servers_alive && (( waited < EXIT_GRACE * 10 + 30 )); do sleep 0.1; waited=$((waited + 1)); done
  if servers_alive; then
    "${NODE0[@]}" bash "$NODE_SCRIPT" exec bash "$NODE_SCRIPT" mpirun-stop
    sleep 1
  fi
  kill -KILL "$MPIRUN_PID" 2>/dev/null
  wait "$MPIRUN_PID" 2>/dev/null
  event "servers_stopped"
}
on_rank0() { run_fg "${NODE0[@]}" bash "$NODE_SCRIPT" exec "$@"; }

# Remove every container of the run on every node; a node that fails is reported, not skipped.
teardown() {
  (( CONTAINERS )) || return 0
  local h st bad=()
  event "containers_stopping"
  timeout --kill-after=5 120 "${NODE_STEP[@]}" --output="$LOGS/docker-down-%N.log" \
    bash "$NODE_SCRIPT" down
  for h in "${HOSTS[@]}"; do
    st=$(cat "$STATE/docker/$h.down" 2>/dev/null || echo "failed no answer from the teardown step")
    if [ "$st" != ok ]; then
      bad+=("$h")
      event "teardown_failed $h ${st#failed }"
      echo "ftcluster: teardown failed on $h: ${st#failed }; remove its containers by hand:" \
        "docker rm -f \$(docker ps -aq --filter label=$LABEL=$RUN_ID)" >&2
    fi
  done
  # (a Jinja template: no hash-length expansions, they would open a Jinja comment)
  if [ -n "${bad[*]:-}" ]; then
    event "failed teardown failed on ${bad[*]}"
    return 1
  fi
  event "containers_stopped"
}

# One guard per node for as long as the run has containers: if this script dies without its
# teardown (killed, the job cancelled or out of time, the machine running it lost), Slurm
# ends the guard step with SIGTERM, or the ssh session hangs up, and each guard removes its
# node's containers of the run.
start_guards() {
  "${NODE_STEP[@]}" --output="$LOGS/docker-guard-%N.log" bash "$NODE_SCRIPT" guard &
  GUARD_PID=$!
}
stop_guards() {
  [ -n "$GUARD_PID" ] || return 0
  kill -TERM "$GUARD_PID" 2>/dev/null
  timeout 30 tail --pid="$GUARD_PID" -f /dev/null
  kill -KILL "$GUARD_PID" 2>/dev/null
  wait "$GUARD_PID" 2>/dev/null
  GUARD_PID=
}

docker_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$FG_PID" ]; then
    # An interrupted node step first ends, so no container appears after the teardown.
    kill -TERM "$FG_PID" 2>/dev/null
    wait "$FG_PID" 2>/dev/null
  fi
  stop_servers
  teardown || { (( rc )) || rc=1; }
  stop_guards
  # The keys are only good for this run's containers, which are gone now.
  rm -rf "$SSH_DIR"
  event "done $rc"
  exit "$rc"
}

trap docker_cleanup EXIT
trap 'event "interrupted"; exit 130' INT TERM
event "job_started $(hostname) ${SLURM_JOB_ID:-}"

find_hosts
if [ ! -s "$SSH_DIR/id_ed25519" ] || [ ! -s "$SSH_DIR/host_ed25519.pub" ]; then
  fail "no run keys in $SSH_DIR (ftcluster launch makes them before submitting)"
fi
# Every node presents the run's host key on the ssh port: ssh verifies it, never skips it.
HOST_KEY=$(cut -d' ' -f1,2 "$SSH_DIR/host_ed25519.pub")
for h in "${HOSTS[@]}"; do printf '[%s]:%s %s\n' "$h" "$SSH_PORT" "$HOST_KEY"; done >"$SSH_DIR/known_hosts"
MPI_HOSTS=$(printf '%s:1,' "${HOSTS[@]}")
MPI_HOSTS=${MPI_HOSTS%,}

event "containers_starting ${HOSTS[*]}"
mkdir -p "$STATE/docker"
CONTAINERS=1
start_guards
run_fg "${NODE_STEP[@]}" --output="$LOGS/docker-up-%N.log" bash "$NODE_SCRIPT" up
BAD=()
for h in "${HOSTS[@]}"; do
  st=$(cat "$STATE/docker/$h.up" 2>/dev/null \
    || echo "failed the node step did not run: $(tail -n 1 "$LOGS/docker-up-$h.log" 2>/dev/null \
      || echo "see logs/docker-up-$h.log")")
  if [ "${st%% *}" = ok ]; then
    event "node_ready $h ${st#ok }"
  else
    BAD+=("$h")
    event "node_failed $h ${st#failed }"
    [ -n "${FIRST_PROBLEM:-}" ] || FIRST_PROBLEM="$h: ${st#failed }"
  fi
done
[ -z "${BAD[*]:-}" ] || fail "containers failed to start on ${BAD[*]}: $FIRST_PROBLEM"
event "containers_ready $MPI_HOSTS"

# MPI world check over the same ssh path and containers as the servers.
event "mpicheck_started"
if ! timeout --kill-after=5 120 "${NODE0[@]}" bash "$NODE_SCRIPT" exec bash "$NODE_SCRIPT" \
  mpirun "$MPI_HOSTS" "$PY" -m ftcluster.rank.mpicheck --nodes "$NODES" --tritonserver "$TRITON" \
  --rank0-host "$RANK0_NODE" --out "$RESULTS/mpicheck.json" >"$LOGS/mpicheck.log" 2>&1; then
  cat "$LOGS/mpicheck.log" >&2
  problem=$(grep -m1 -E '^PROBLEM: |error|ERROR|denied|failed' "$LOGS/mpicheck.log" | tr -s '[:space:]' ' ')
  fail "MPI check failed: ${problem:-see logs/mpicheck.log}"
fi
event "mpicheck_ok"
"${NODE0[@]}" bash "$NODE_SCRIPT" exec bash "$NODE_SCRIPT" mpirun "$MPI_HOSTS" bash "$NODE_SCRIPT" rank \
  >"$LOGS/mpirun.log" 2>&1 &
MPIRUN_PID=$!
wait_ready
if (( RUN_CLIENT )); then run_client || exit $?; fi
if (( KEEP_SERVING )); then
  event "serving $RANK0_URL"
  wait "$MPIRUN_PID"
  fail "mpirun ended while serving"
fi
