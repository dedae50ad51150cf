#!/bin/bash
# Node-side Docker steps of ftcluster run gpt-2n (generated). The job script runs:
#   on every node, through srun:  docker_node.sh up | guard | down | reap (before a restart)
#   on rank 0's node:             docker_node.sh exec CMD...   (CMD inside this run's container,
#                                                               through `run`: with the spec's env)
# and inside the containers:      docker_node.sh sshd | mpirun HOSTS CMD... | rank | reap_inside
# Values are shell-quoted data; the shared variable block defines some this script does not use.
# shellcheck disable=SC2016,SC2034,SC2089,SC2090
set -uo pipefail
# shellcheck source=/dev/null
. /shared/runs/gpt-2n/scripts/env.sh || { echo "ftcluster: cannot read the spec's env, scripts/env.sh" >&2; exit 1; }
RUN_ID=gpt-2n
RUN_DIR=/shared/runs/gpt-2n
LOGS=/shared/runs/gpt-2n/logs
STATE=/shared/runs/gpt-2n/state
SCRIPTS=/shared/runs/gpt-2n/scripts
NODES=2
HTTP_PORT=8100
PORT_STRIDE=0
ID_PREFIX=ftc-gpt-2n
TRITON=/opt/tritonserver/bin/tritonserver
EXIT_GRACE=20
export RUN_ID RUN_DIR LOGS STATE ID_PREFIX PORT_STRIDE
IMAGE=triton_with_ft:22.12
IMAGE_TAR=''
DOCKER_HOST_TEMPLATE=''
CNAME=ftc-gpt-2n
LABEL=org.ftcluster.run
RUN_ARGS=(--network host --ipc host --cap-add IPC_LOCK --shm-size 32g -v /shared/models:/models:ro -v /shared/runs/gpt-2n:/shared/runs/gpt-2n --device /dev/infiniband)
SSH_PORT=11068
SSH_DIR=/shared/runs/gpt-2n/state/ssh
MPI_IF=''
ENV_KEYS=(NCCL_SOCKET_IFNAME)
GPU_MODE=request
GPUS=8
# Inside a container: private copies of the run's keys (sshd and ssh refuse loose modes).
IN_SSH=/run/ftcluster-ssh
# What runs in a container runs as you, the job's user, with your groups, as on Pyxis: nothing
# of the run folder is read or written as root. On NFS with root_squash the containers' root is
# nobody, who may not enter your 0700 run folder; and the container's root keeps no
# DAC_OVERRIDE/DAC_READ_SEARCH, so it reads no file of yours that root squashing would hide.
RUN_UID=$(id -u)
RUN_GID=$(id -g)
RUN_USER=$(id -un 2>/dev/null)
[[ $RUN_USER =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || RUN_USER=ftcluster

# The node's name as the job script knows it: FTC_NODE from the ssh fan-out (and passed into
# the container), Slurm's node name, else the short hostname.
NODE=${FTC_NODE:-${SLURMD_NODENAME:-$(hostname -s)}}
if [ -n "$DOCKER_HOST_TEMPLATE" ]; then
  export DOCKER_HOST=${DOCKER_HOST_TEMPLATE//\{node\}/$NODE}
fi

# The last line of a command's output that says something (docker puts the cause last, then
# sometimes a "Run 'docker run --help'" hint), on one line.
lastline() {
  printf '%s\n' "$1" | sed -e '/^[[:space:]]*$/d' -e "/^\(Run\|See\) '.*--help'/d" | tail -n 1 | tr -s '[:space:]' ' '
}

# Per-node outcome for the job script (one writer per file: safe on a shared filesystem).
record() { mkdir -p "$STATE/docker" && printf '%s\n' "$2" >"$STATE/docker/$NODE.$1"; }
node_fail() {
  record up "failed $*"
  echo "ftcluster: $NODE: $*" >&2
  exit 1
}

ensure_image() {
  local out
  docker image inspect "$IMAGE" >/dev/null 2>&1 && return 0
  if [ -n "$IMAGE_TAR" ]; then
    out=$(docker load -i "$IMAGE_TAR" 2>&1) \
      || node_fail "image $IMAGE is not on $NODE and docker load -i $IMAGE_TAR failed: $(lastline "$out")"
    docker image inspect "$IMAGE" >/dev/null 2>&1 \
      || node_fail "$IMAGE_TAR does not hold image $IMAGE ($(lastline "$out"))"
  else
    out=$(docker pull -q "$IMAGE" 2>&1) \
      || node_fail "image $IMAGE is not on $NODE and docker pull failed: $(lastline "$out") (set container.image_tar for sites without a registry)"
  fi
}

# The node's GPUs for its container: the ones Slurm gave the step (host indices), else the
# plan's first GPUS; as a device request (--gpus) or through the NVIDIA runtime.
gpu_args() {
  local ids=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}
  [ -n "$ids" ] || ids=$(seq -s, 0 $((GPUS - 1)))
  case "$GPU_MODE" in
    request) GPU_ARGS=(--gpus "\"device=$ids\"") ;;
    nvidia-runtime) GPU_ARGS=(--runtime nvidia -e "NVIDIA_VISIBLE_DEVICES=$ids") ;;
    *) GPU_ARGS=() ;;
  esac
}

# The container's root, on the container's own files alone (it reads nothing of the run folder):
# an account for you where the image has none (ssh and sshd look their user up) and the folder
# for the run's keys, yours.
ACCOUNT='getent passwd "$1" >/dev/null || printf "%s:x:%s:%s::/tmp:/bin/sh\n" "$3" "$1" "$2" >>/etc/passwd || exit 1
getent group "$2" >/dev/null || printf "%s:x:%s:\n" "$3" "$2" >>/etc/group || exit 1
mkdir -p "$4" && chown "$1:$2" "$4" && chmod 700 "$4"'

up() {
  local t0=$EPOCHREALTIME out g GPU_ARGS=() USER_ARGS=(--user "$RUN_UID:$RUN_GID")
  rm -f "$STATE/docker/$NODE.up"
  command -v docker >/dev/null || node_fail "no docker CLI on $NODE"
  ensure_image
  gpu_args
  for g in $(id -G); do
    [[ $g =~ ^[0-9]+$ ]] && [ "$g" != "$RUN_GID" ] && USER_ARGS+=(--group-add "$g")
  done
  # Kept alive by sleep (not the image's entrypoint); the work arrives through docker exec.
  out=$(docker run -d --name "$CNAME" --label "$LABEL=$RUN_ID" "${RUN_ARGS[@]}" "${GPU_ARGS[@]}" "${USER_ARGS[@]}" \
    --cap-drop DAC_OVERRIDE --cap-drop DAC_READ_SEARCH --entrypoint sleep "$IMAGE" infinity 2>&1) \
    || node_fail "docker run failed: $(lastline "$out")"
  out=$(docker exec -u 0 "$CNAME" sh -c "$ACCOUNT" _ "$RUN_UID" "$RUN_GID" "$RUN_USER" "$IN_SSH" 2>&1) \
    || node_fail "could not add your account (uid $RUN_UID) to the container: $(lastline "$out")"
  out=$(docker exec "$CNAME" bash "$SCRIPTS/docker_node.sh" sshd 2>&1) || node_fail "$(lastline "$out")"
  record up "ok $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')"
}

# Inside a container: NVIDIA's images keep Open MPI under /usr/local/mpi, which the FT README
# puts on PATH by hand; ssh sessions (mpirun's orted) get this PATH through sshd's SetEnv.
mpi_on_path() {
  if ! command -v mpirun >/dev/null && [ -x /usr/local/mpi/bin/mpirun ]; then
    PATH="/usr/local/mpi/bin:$PATH"
  fi
}

# Inside a container: this run's sshd on SSH_PORT with the run's host key, accepting only the
# run's client key; ssh/mpirun check hosts against known_hosts (written by the job script).
sshd_start() {
  local sshd want got i var setenv=()
  sshd=$(command -v sshd || echo /usr/sbin/sshd)
  [ -x "$sshd" ] || { echo "image $IMAGE has no sshd (install openssh-server in it)"; exit 1; }
  command -v ssh >/dev/null || { echo "image $IMAGE has no ssh client (install openssh-client)"; exit 1; }
  # sshd run as root wants its privilege-separation folder; as you, it needs none.
  (( EUID )) || mkdir -p /run/sshd
  install -m 600 "$SSH_DIR/host_ed25519" "$IN_SSH/host_key"
  install -m 600 "$SSH_DIR/id_ed25519" "$IN_SSH/id_ed25519"
  install -m 600 "$SSH_DIR/id_ed25519.pub" "$IN_SSH/authorized_keys"
  install -m 644 "$SSH_DIR/known_hosts" "$IN_SSH/known_hosts"
  # Sessions (mpirun's orted) get the container's environment: PATH to mpirun/orted etc.
  for var in PATH LD_LIBRARY_PATH OPAL_PREFIX PYTHONPATH "${ENV_KEYS[@]}"; do
    [ -n "${!var:-}" ] && setenv+=("\"$var=${!var}\"")
  done
  cat >"$IN_SSH/sshd_config" <<EOF
Port $SSH_PORT
HostKey $IN_SSH/host_key
AuthorizedKeysFile $IN_SSH/authorized_keys
PidFile $IN_SSH/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
${setenv:+SetEnv ${setenv[*]}}
EOF
  "$sshd" -f "$IN_SSH/sshd_config" -E "$LOGS/sshd-$NODE.log" \
    || { echo "sshd failed to start on $NODE: $(tail -n 1 "$LOGS/sshd-$NODE.log" 2>/dev/null)"; exit 1; }
  # Our sshd, not another process on the port, must answer on the node's name.
  want=$(cut -d' ' -f2 "$SSH_DIR/host_ed25519.pub")
  for ((i = 0; i < 50; i++)); do
    got=$(ssh-keyscan -T 2 -t ed25519 -p "$SSH_PORT" "$NODE" 2>/dev/null | cut -d' ' -f3)
    [ "$got" = "$want" ] && return 0
    grep -q "Address already in use" "$LOGS/sshd-$NODE.log" 2>/dev/null && break
    sleep 0.1
  done
  if grep -q "Address already in use" "$LOGS/sshd-$NODE.log" 2>/dev/null; then
    echo "ssh_port $SSH_PORT is taken on $NODE by another process (choose another ssh_port)"
  else
    echo "this run's sshd does not answer on $NODE:$SSH_PORT: $(tail -n 1 "$LOGS/sshd-$NODE.log" 2>/dev/null)"
  fi
  exit 1
}

# Inside rank 0's container: one rank per node, started over ssh with the run's key.
# run_mpirun GRACE HOSTS CMD...: when a rank fails, Open MPI 4's daemons send the others SIGCONT,
# sleep odls_base_sigkill_timeout, SIGTERM, sleep it again, then SIGKILL -- even for ranks that
# have exited already. The servers get the exit grace; a check or a job step (mpirun_brief) ends
# within a second, not after twice the grace.
run_mpirun() {
  local grace=$1 hosts=$2 mca_if=()
  shift 2
  if [ -n "$MPI_IF" ]; then
    mca_if=(--mca btl_tcp_if_include "$MPI_IF" --mca oob_tcp_if_include "$MPI_IF")
  fi
  exec mpirun --allow-run-as-root -np "$NODES" -H "$hosts" \
    --mca plm_rsh_args "-p $SSH_PORT -i $IN_SSH/id_ed25519 -o UserKnownHostsFile=$IN_SSH/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes -o LogLevel=ERROR" \
    --mca odls_base_sigkill_timeout "$grace" "${mca_if[@]}" -x FTC_INCARNATION "$@"
}

down() {
  local ids out
  rm -f "$STATE/docker/$NODE.down"
  ids=$(docker ps -aq --filter "label=$LABEL=$RUN_ID" 2>&1) \
    || { record down "failed docker ps: $(lastline "$ids")"; exit 1; }
  if [ -n "$ids" ]; then
    # One id per line; word splitting is wanted here.
    # shellcheck disable=SC2086
    out=$(docker rm -f $ids 2>&1) || { record down "failed docker rm -f: $(lastline "$out")"; exit 1; }
    ids=$(docker ps -aq --filter "label=$LABEL=$RUN_ID" 2>&1)
    [ -z "$ids" ] || { record down "failed containers remain: $(lastline "$ids")"; exit 1; }
  fi
  remove_shm
  record down ok
}

# Whether process $1 lives (a zombie does not: PID 1 is sleep, which reaps nobody).
alive() {
  local state
  read -r state <"/proc/$1/stat" 2>/dev/null || return 1
  state=${state##*) }
  [ "${state%% *}" != Z ]
}

# Inside a container, before a restart of the servers: every process but the container's own
# (PID 1), this run's sshd and this script is one of the killed world's (orted, a rank, its
# stubs, mpirun): all are killed, so the next world starts in a clean container. Zombies
# (PID 1 is sleep, which reaps nobody) hold nothing and are left. An sshd that is gone (killed,
# the OOM killer) is started again: the next world's mpirun reaches this container through it.
reap_inside() {
  local p pid state sshd_pid='' i left
  [ -r "$IN_SSH/sshd.pid" ] && read -r sshd_pid <"$IN_SSH/sshd.pid"
  if ! [[ $sshd_pid =~ ^[0-9]+$ ]] || ! alive "$sshd_pid"; then sshd_pid=''; fi
  for ((i = 0; i < 50; i++)); do
    left=()
    for p in /proc/[0-9]*; do
      pid=${p#/proc/}
      case " 1 $$ $sshd_pid " in *" $pid "*) continue ;; esac
      read -r state <"$p/stat" 2>/dev/null || continue
      state=${state##*) }
      [ "${state%% *}" = Z ] || left+=("$pid")
    done
    if [ -z "${left[*]}" ]; then
      [ -n "$sshd_pid" ] && return 0
      echo "ftcluster: $NODE: this run's sshd in $CNAME is gone: starting it again"
      mpi_on_path
      sshd_start
      return
    fi
    kill -KILL "${left[@]}" 2>/dev/null
    sleep 0.1
  done
  echo "processes remain in $CNAME on $NODE: ${left[*]}"
  return 1
}

# Before a restart of the servers: the node's container emptied of the killed world. One that
# no longer runs (its sleep killed, the OOM killer, a daemon restarted without live-restore, a
# `docker rm` by hand) is made again as `up` made it (same name, keys and account): a dead
# container is a fault the restart mends, not the end of the service.
reap() {
  local running
  running=$(docker ps -q --filter "name=^${CNAME}\$" --filter status=running 2>&1) \
    || { echo "ftcluster: $NODE: docker ps: $(lastline "$running")" >&2; exit 1; }
  if [ -z "$running" ]; then
    echo "ftcluster: $NODE: container $CNAME no longer runs: making it again"
    docker rm -f "$CNAME" >/dev/null 2>&1
    up
    return
  fi
  exec docker exec "$CNAME" bash "$SCRIPTS/docker_node.sh" reap_inside
}

# The guard's removal: every container of the run on this node.
remove_all() {
  local ids
  ids=$(docker ps -aq --filter "label=$LABEL=$RUN_ID" 2>/dev/null)
  # One id per line; word splitting is wanted here.
  # shellcheck disable=SC2086
  [ -z "$ids" ] || docker rm -f $ids
}
# Waits until its step ends (SIGTERM from Slurm or the job, SIGHUP when the ssh session is gone),
# then removes this node's containers of the run (remove_all): the teardown of last resort, for
# when the job cannot run its own (cancelled by hand, out of time, the machine running it lost).
# USR1 asks for the same (srun passes USR1 on to its tasks; a TERM to srun kills them): the
# job's own teardown, where the guards' removal records its outcome (Pyxis).
NAPPER=
# What the run's SIGKILLed ranks left in this node's /dev/shm (rank_server.sh names them).
remove_shm() { rm -rf -- "/dev/shm/ftc+gpt-2n+"* 2>/dev/null; return 0; }
guard() {
  declare -F remove_all >/dev/null || { echo "guard: no remove_all defined" >&2; exit 2; }
  # shellcheck disable=SC2317  # reached through the trap
  on_end() {
    # The removal is not cut short by a second signal (Slurm's TERM to the step and srun's
    # passing on of the job's own USR1 may both come); SIGKILL after KillWait still ends it.
    trap '' TERM HUP INT USR1
    kill "$NAPPER" 2>/dev/null
    remove_all >/dev/null 2>&1
    remove_shm
    exit 0
  }
  trap on_end TERM HUP INT USR1
  while :; do
    sleep 5 &
    NAPPER=$!
    wait "$NAPPER"
  done
}

case "${1:-}" in
  up) up ;;
  guard) guard ;;
  down) down ;;
  exec) shift; exec docker exec -e FTC_NODE="$NODE" -e FTC_INCARNATION="${FTC_INCARNATION:-0}" "$CNAME" \
    bash "$SCRIPTS/docker_node.sh" run "$@" ;;
  run) shift; exec "$@" ;;   # inside the container, with the spec's env (sourced above)
  reap) reap ;;
  reap_inside) reap_inside ;;
  sshd) mpi_on_path; sshd_start ;;
  mpirun) shift; mpi_on_path; run_mpirun "$EXIT_GRACE" "$@" ;;
  mpirun_brief) shift; mpi_on_path; run_mpirun 0 "$@" ;;
  rank) exec bash "$SCRIPTS/rank_server.sh" >"$LOGS/rank${OMPI_COMM_WORLD_RANK:-0}.stdout" 2>&1 ;;
  *) echo "usage: $0 up|guard|down|reap|exec CMD...|sshd|mpirun[_brief] HOSTS CMD...|rank|reap_inside|run CMD..." >&2; exit 2 ;;
esac
