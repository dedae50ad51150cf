#!/bin/bash
# local_rank.sh STDOUT|- CMD...: one rank of a local run, started by mpirun. Each "node" sees
# only its own GPUS_PER_NODE GPUs, as on a real cluster (FT refuses a rank that sees more or
# fewer): rank r gets slice r of GPU_POOL as CUDA_VISIBLE_DEVICES. Its output goes to STDOUT
# with "{rank}" replaced by the rank (unless "-"), then CMD runs in its place; CMD ". SCRIPT"
# (a bash script of the run's own, the rank's server wrapper) runs in this very shell: one bash
# start less on every rank's way to its server. No subshell either: each fork is a few ms of a
# start that every rank's server waits for.
set -u
r=${OMPI_COMM_WORLD_RANK:-0}
# Both are numbers (mpirun's, the job's) before they reach an arithmetic context.
[[ $r =~ ^[0-9]+$ && ${GPUS_PER_NODE:-} =~ ^[0-9]+$ ]] || { echo "local_rank.sh: bad rank or GPUS_PER_NODE" >&2; exit 2; }
IFS=, read -ra pool <<<"${GPU_POOL:-}"
# ${pool[@]+...}: an empty array is no unbound variable, also for bash before 4.4 under set -u.
pool=(${pool[@]+"${pool[@]:r*GPUS_PER_NODE:GPUS_PER_NODE}"})
printf -v CUDA_VISIBLE_DEVICES '%s,' ${pool[@]+"${pool[@]}"}
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%,}
export CUDA_VISIBLE_DEVICES
if [ "$1" != - ]; then exec >"${1//\{rank\}/$r}" 2>&1; fi
shift
if [ "${1:-}" = . ]; then
  shift
  unset r pool
  set +u
  # shellcheck source=/dev/null
  . "$@"
  exit
fi
exec "$@"
