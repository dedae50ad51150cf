#!/bin/bash
# ftcluster run gpt-2n: 2 rank(s) of one MPI world on this machine, started by
# mpirun (generated; run it directly: bash job.sh). Rank r serves HTTP on 18000 + r*10.
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

MPIRUN=mpirun
SERVER_PID=
servers_alive() { [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; }
# mpirun makes each rank the leader of its own process group (its server and the server's
# stub inside): a signal to the group reaches all of them, once the rank is identified as the
# recorded one (signal_rank.sh). Ranks: numbers.
signal_ranks() {
  local sig=$1 f
  shift
  for f in "$@"; do
    f="$STATE/rank$f.pid"
    [ -e "$f" ] && bash "$SCRIPTS/signal_rank.sh" "$sig" "$f" group
  done
  return 0
}
term_rank0() { [ -e "$STATE/rank0.pid" ] && signal_ranks TERM 0; }
# Normal end: rank 0 first (stop_rank0), then SIGKILL to every rank. A failure (FAILING=1):
# SIGKILL to every rank at once.
stop_servers() {
  [ -n "$SERVER_PID" ] || return 0
  (( FAILING )) || stop_rank0
  # shellcheck disable=SC2046  # one rank number per word
  signal_ranks KILL $(seq 0 $((NODES - 1)))
  kill -KILL "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  rm -rf "$MPI_TMP"
  event "servers_stopped"
}

trap cleanup EXIT
trap 'INTERRUPTED=1' INT TERM
event "job_started $(hostname) $$"
# Every rank on this machine: they share its address and take ports rank*PORT_STRIDE apart.
# Each "node" sees only its own gpus_per_node GPUs, as on a real cluster (FT refuses a rank that
# sees more or fewer): rank r gets slice r of CUDA_VISIBLE_DEVICES, or of 0..N-1 when unset.
GPUS_PER_NODE=1
GPU_POOL=${CUDA_VISIBLE_DEVICES-$(seq -s, 0 $((NODES * GPUS_PER_NODE - 1)))}
export GPUS_PER_NODE GPU_POOL
# Run first by every rank under mpirun (bash -c "$GPU_SLICE; ..."): its slice of the pool.
# shellcheck disable=SC2016  # expanded by each rank's bash, not here
GPU_SLICE='r=${OMPI_COMM_WORLD_RANK:-0}; IFS=, read -ra pool <<<"$GPU_POOL"
  export CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${pool[*]:r*GPUS_PER_NODE:GPUS_PER_NODE}")'
# Open MPI's session folder (its PMIx sockets) in a folder of this run: a SIGKILLed mpirun
# leaves it behind, and a later mpirun that gets the same pid cannot start its PMIx server there.
MPI_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ftc-mpi.XXXXXX")
TMPDIR=$MPI_TMP OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 FTC_RANK_HOST=127.0.0.1 \
  "$MPIRUN" -np "$NODES" --oversubscribe --bind-to none -x GPUS_PER_NODE -x GPU_POOL \
  bash -c "$GPU_SLICE"'
    exec bash "$1" >"$2/rank$r.stdout" 2>&1' rank "$SCRIPTS/rank_server.sh" "$LOGS" \
  >"$LOGS/mpirun.log" 2>&1 &
SERVER_PID=$!
wait_ready
if (( RUN_CLIENT )); then run_client || exit $?; fi
if (( KEEP_SERVING )); then
  PHASE="while serving"
  event "serving $RANK0_URL"
  wait "$SERVER_PID"
  interrupt_point
  fail "a server rank exited while serving"
fi
