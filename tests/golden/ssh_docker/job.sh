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
RUN_HOSTS=(dgx01 dgx02)
mkdir -p "$LOGS" "$STATE" "$RESULTS"

# One line per milestone; `ftcluster launch/status` follow this file.
event() { printf '%s %s\n' "$(date +%s.%N)" "$*" >>"$STATE/events"; }

FAILING=0
PHASE="during start-up"   # where the run is, for failure messages

# INT/TERM only set a flag, acted on between commands (interrupt_point, in nap and after each
# wait): a trap that exits while `read -t` waits leaves bash 5.2 a live timer that crashes the
# teardown (SIGSEGV), and the run's servers_stopped and done are never written.
INTERRUPTED=0
interrupt_point() {
  (( INTERRUPTED )) || return 0
  INTERRUPTED=0
  trap '' INT TERM
  event "interrupted"
  exit 130
}

# The rank that died first (state/rank<R>.exit: "CODE EPOCH died|stopped", written by
# rank_server.sh), or nothing. Ranks that were asked to stop are not a cause.
first_exited_rank() {
  local f r code t how best='' best_t=''
  for f in "$STATE"/rank*.exit; do
    [ -e "$f" ] || continue
    read -r code t how <"$f" || true
    [ "${how:-died}" = died ] || continue
    r=${f##*/rank}
    r=${r%.exit}
    t=${t:-0}
    t=${t/./}
    if [ -z "$best" ] || (( t < best_t )); then best=$r best_t=$t; fi
  done
  [ -n "$best" ] || return 1
  printf '%s\n' "$best"
}

rank_node() { cat "$STATE/rank$1.host" 2>/dev/null || echo '?'; }

# When the whole step was killed (Slurm's PMIx plugin aborts a step whose MPI process exits
# without MPI_Finalize, wrappers included), no rank wrote an exit: the rank whose server log
# holds the earliest error line (glog "E<MMDD> <time>") is the cause. Prints "RANK LINE".
HARMLESS_ERRORS='CudaDriverHelper|NVML|DCGM|pinned'   # what a CPU-only server always logs
first_rank_with_error() {
  local r line best='' best_line=''
  for ((r = 0; r < NODES; r++)); do
    line=$(grep -E '^E[0-9]{4} [0-9:.]+ ' "$LOGS/server-rank$r.log" 2>/dev/null \
      | grep -m1 -v -E "$HARMLESS_ERRORS") || continue
    if [ -z "$best" ] || [[ ${line:1:20} < ${best_line:1:20} ]]; then best=$r best_line=$line; fi
  done
  [ -n "$best" ] || return 1
  printf '%s %s\n' "$best" "$best_line"
}

# A normal end stops rank 0 first: FT's other ranks must live while its last requests finish.
# The including template's term_rank0 sends it SIGTERM (false: nothing to signal); this waits
# until its wrapper recorded its exit, the servers ended or the exit grace ran out. The caller
# then SIGKILLs every rank: the others sit in model load for good.
stop_rank0() {
  local waited=0
  servers_alive && term_rank0 || return 0
  while servers_alive && [ ! -e "$STATE/rank0.exit" ] && (( waited < EXIT_GRACE * 10 )); do
    nap 0.1
    waited=$((waited + 1))
  done
}

# Any failure stops every rank at once (stop_servers sees FAILING=1): the MPI world is broken,
# so a graceful shutdown buys nothing -- rank 0's requests would hang in a broadcast.
fail() {
  local rank node code why="$*"
  # A step that ended because the job was interrupted: the interrupt is the cause.
  interrupt_point
  FAILING=1
  if rank=$(first_exited_rank); then
    node=$(rank_node "$rank")
    read -r code _ <"$STATE/rank$rank.exit"
    event "rank_failed $rank $node $code"
    why="rank $rank on $node exited (code $code) $PHASE"
    # A cause the rank named itself (a port in use) says more than its exit.
    if [ -s "$STATE/rank$rank.problem" ]; then why="$(cat "$STATE/rank$rank.problem") (rank $rank)"; fi
    echo "ftcluster: rank $rank on $node exited; last lines of its log:" >&2
    tail -n 20 "$LOGS/server-rank$rank.log" "$LOGS/rank$rank.stdout" >&2 2>/dev/null || true
  elif [[ $why == "the server step ended"* ]] && rank=$(first_rank_with_error); then
    local line=${rank#* }
    rank=${rank%% *}
    node=$(rank_node "$rank")
    event "rank_failed $rank $node ?"
    why="rank $rank on $node failed $PHASE (the step was ended with it): ${line:0:300}"
  fi
  event "failed $why"
  echo "ftcluster: $why" >&2
  exit 1
}

check_servers() {
  if first_exited_rank >/dev/null; then fail "a server rank exited"; fi
  servers_alive || fail "the server step ended"
  if (( SECONDS >= READY_DEADLINE )); then fail "not ready after ${READY_TIMEOUT}s (server.ready_timeout): $(not_ready_why)"; fi
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

# Rank 0 is ours and serving: /v2 names OUR --id (not a stale server on the port), and every
# model, the served one included, is ready.
rank0_ready() {
  http_get "$RANK0_HOST" "$HTTP_PORT" /v2/health/ready 2>/dev/null \
    && http_get "$RANK0_HOST" "$HTTP_PORT" /v2 2>/dev/null \
    && [[ $HTTP_BODY == *"\"name\":\"$ID_PREFIX-rank0\""* ]] \
    && http_get "$RANK0_HOST" "$HTTP_PORT" "/v2/models/$SERVED_MODEL/ready" 2>/dev/null
}

# The ranks != 0 whose server has not reached FT's model-instance initialisation yet.
ranks_not_loaded() {
  local r waiting=()
  for ((r = 1; r < NODES; r++)); do [ -e "$STATE/rank$r.loaded" ] || waiting+=("$r"); done
  printf '%s' "${waiting[*]:-}"
}

# Which rank is not ready, and why, for the time-out message.
not_ready_why() {
  local r why=()
  rank0_ready || why+=("rank 0 gives no answer on ${RANK0_URL:-its HTTP port} with our id and model $SERVED_MODEL ready")
  for r in $(ranks_not_loaded); do
    if [ ! -s "$STATE/rank$r.host" ]; then
      why+=("rank $r never started")
    else
      why+=("rank $r on $(rank_node "$r") never reached model load (no FT TRITONBACKEND_ModelInstanceInitialize line in logs/server-rank$r.log)")
    fi
  done
  local joined
  joined=$(printf '%s; ' "${why[@]}")
  printf '%s' "${joined%; }"
}

# A sleep without a process per call: read times out on a pipe nobody writes to.
exec {NAP_FD}<> <(:)
nap() { read -rt "$1" -u "$NAP_FD" || :; interrupt_point; }

# Ready = rank 0 answers with our id and its models ready, AND every other rank's server is
# alive and inside model load. FT's ranks != 0 never leave model load, so they never answer
# HTTP and are never asked: rank_server.sh marks them loaded from their log. Every 10 ms rank 0
# is asked (a refused connect until it listens) and the server step's liveness checked (a
# signal 0): no file access. The run folder is read with a back-off to every 250 ms during a
# long load, and every 10 ms again once rank 0's model is loaded.
wait_ready() {
  local polls=0 every=1
  READY_DEADLINE=$((SECONDS + READY_TIMEOUT))
  while [ ! -s "$STATE/rank0.host" ]; do check_servers; nap 0.05; done
  RANK0_HOST=$(cat "$STATE/rank0.host")
  RANK0_URL="$RANK0_HOST:$HTTP_PORT"
  event "servers_starting $RANK0_HOST"
  until rank0_ready && [ -z "$(ranks_not_loaded)" ]; do
    if (( ++polls >= every )); then
      polls=0
      check_servers
      if [ -e "$STATE/rank0.loaded" ]; then every=1; elif (( every < 25 )); then every=$((every + 1)); fi
    else
      servers_alive || fail "the server step ended"
    fi
    nap 0.01
  done
  check_servers
  event "ready $RANK0_URL"
}

# The client runs beside the servers' watch: a rank that dies mid-request leaves rank 0 waiting
# in a broadcast, so the run fails (every rank stopped) instead of hanging. It runs here, on the
# job's host with the launching Python, and reaches rank 0 over the network: nothing of
# ftcluster needs to be inside the user's image.
CLIENT_PID=
run_client() {
  PHASE="during the client run"
  event "client_started"
  local rc=0
  "$PY" -m ftcluster.client identity --url "$RANK0_URL" --model "$SERVED_MODEL" \
    "${CLIENT_ARGS[@]}" --result-file "$RESULTS/client.json" >"$LOGS/client.log" 2>&1 &
  CLIENT_PID=$!
  while kill -0 "$CLIENT_PID" 2>/dev/null; do
    servers_alive || fail "the server step ended during the client run"
    nap 0.05
  done
  wait "$CLIENT_PID" || rc=$?
  CLIENT_PID=
  # A client that failed because a rank died (rank 0 itself, say) names that rank: give the
  # servers' exit a moment to show.
  local i
  for ((i = 0; rc && i < 20; i++)); do
    if first_exited_rank >/dev/null || ! servers_alive; then fail "the client failed"; fi
    nap 0.05
  done
  event "client_done $rc"
  return "$rc"
}

# A foreground step the INT/TERM trap can interrupt (bash runs traps only between commands).
FG_PID=
run_fg() {
  "$@" &
  FG_PID=$!
  wait "$FG_PID"
  local rc=$?
  interrupt_point
  FG_PID=
  return "$rc"
}

# The hook for a style's containers: removes them on every node after the servers stopped
# (false when a node failed). Styles with containers define their own after this one.
# shellcheck disable=SC2317  # replaced by a later definition where a style has containers
containers_down() { :; }

# The one teardown, on every exit (EXIT trap): client, an interrupted foreground step, the
# servers, then the style's containers_down.
cleanup() {
  local rc=$?
  # The teardown runs to its end: a second TERM (scancel signals the batch shell and its
  # steps) must not cut it short. What cannot finish is SIGKILLed by whoever stops the job.
  trap - EXIT
  trap '' INT TERM
  # A signal that arrived after the last interrupt point must not end the teardown at its first
  # nap (interrupt_point would exit 130, skipping containers_down and done); none can come now.
  INTERRUPTED=0
  [ -z "$CLIENT_PID" ] || kill -TERM "$CLIENT_PID" 2>/dev/null
  if [ -n "$FG_PID" ]; then
    # An interrupted node or container step ends first, so no container appears after the teardown.
    kill -TERM "$FG_PID" 2>/dev/null
    wait "$FG_PID" 2>/dev/null
  fi
  stop_servers
  containers_down || { (( rc )) || rc=1; }
  event "done $rc"
  exit "$rc"
}

FANOUT=("$PY" -m ftcluster.fanout --config "$SCRIPTS/nodes.json")
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
GUARD_PID=

servers_alive() { [ -n "$MPIRUN_PID" ] && kill -0 "$MPIRUN_PID" 2>/dev/null; }
# SIGTERM to rank 0's wrapper in its container (pids as the container sees them), once
# identified as the recorded one (signal_rank.sh).
term_rank0() {
  [ -e "$STATE/rank0.pid" ] || return 1
  timeout --kill-after=5 30 "${NODE0[@]}" bash "$NODE_SCRIPT" exec \
    bash "$SCRIPTS/signal_rank.sh" TERM "$STATE/rank0.pid" 2>/dev/null
}
# Normal end: rank 0 first (stop_rank0). A failure (FAILING=1): no graceful stop. Either way
# the container removal (the teardown) is the SIGKILL for every rank.
stop_servers() {
  servers_alive || return 0
  (( FAILING )) || stop_rank0
  kill -KILL "$MPIRUN_PID" 2>/dev/null
  wait "$MPIRUN_PID" 2>/dev/null
  event "servers_stopped"
}

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

# cleanup's hook: the containers on every node, the guards, then the run's keys, which are
# only good for this run's containers.
containers_down() {
  local ok=0
  teardown || ok=1
  stop_guards
  rm -rf "$SSH_DIR"
  return "$ok"
}

trap cleanup EXIT
trap 'INTERRUPTED=1' INT TERM
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
  mpirun "$MPI_HOSTS" python3 "$SCRIPTS/mpicheck.py" --nodes "$NODES" --tritonserver "$TRITON" \
  --rank0-host "$RANK0_NODE" --out "$RESULTS/mpicheck.json" >"$LOGS/mpicheck.log" 2>&1; then
  cat "$LOGS/mpicheck.log" >&2
  problem=$(grep -m1 -E '^PROBLEM: |error|ERROR|denied|failed' "$LOGS/mpicheck.log" \
    | sed 's/^PROBLEM: //' | tr -s '[:space:]' ' ')
  fail "MPI check failed: ${problem:-see logs/mpicheck.log}"
fi
event "mpicheck_ok"
"${NODE0[@]}" bash "$NODE_SCRIPT" exec bash "$NODE_SCRIPT" mpirun "$MPI_HOSTS" bash "$NODE_SCRIPT" rank \
  >"$LOGS/mpirun.log" 2>&1 &
MPIRUN_PID=$!
wait_ready
if (( RUN_CLIENT )); then run_client || exit $?; fi
if (( KEEP_SERVING )); then
  PHASE="while serving"
  event "serving $RANK0_URL"
  wait "$MPIRUN_PID"
  interrupt_point
  fail "mpirun ended while serving"
fi
