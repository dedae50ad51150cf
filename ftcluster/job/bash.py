"""The bash the job runs by `bash -c` (and the node scripts get as a value): the one place of it.

Every string here is bash code; ftcluster.spec.envnames reads each for the variable names it uses, so
that a spec's `env:` cannot set one of them (the job's children, these snippets among them, get
the user's env). Stdlib only, constants only: shipped with the supervisor.
"""

# Drops the given marks (paths of mark files in python_env folders), then each of their folders
# that no run's mark is left in: two rm calls in all, whatever the count (an rm per mark, on a
# host where 16 ranks each claimed 16 folders, cost a 16-node teardown 2 s). The one definition:
# the rank wrapper has it too (rank_server.sh: its own marks, and what dead runs left).
UNMARK_PYTHON_ENVS = ('unmark_python_envs() { local m gone=(); (( $# )) || return 0; rm -f -- "$@"; '
                      'for m in "$@"; do compgen -G "${m%/*}/.ftc+*" >/dev/null || gone+=("${m%/*}"); done; '
                      '(( ${#gone[@]} == 0 )) || rm -rf -- "${gone[@]}"; }')
# bash: RUN_ID then the folders the run's ranks claimed (rank_server.sh): each loses this run's
# marks, and goes once no other run's mark is left in it (a claimed folder with none left goes too).
FREE_PYTHON_ENVS = (UNMARK_PYTHON_ENVS + '; run=$1; shift; marks=(); for d in "$@"; do marks+=("$d/.ftc+$run+r"*); '
                    'done; unmark_python_envs "${marks[@]}"')

# Kills every process on this node that carries the run's server mark (rank_server.sh's
# FTC_SERVER_OF=RUN/rankR/PID): a python backend stub whose tritonserver ended leaves Slurm's
# tracking, and a wrapper ended with its step may not have reaped it. $1: the run id (run ids
# hold no regular-expression character but '.', made literal here).
# $2: tenths of a second to let them end by themselves first (a python backend stub told to
# stop removes its /tmp/python_env_* folder; SIGKILLed, it leaves it): 0 in a failure. The wait
# follows them: half a second with none of them gone ends it (a stub blocked in its model's
# initialize, as every rank != 0 under FT is, never ends by itself; at 16 nodes the whole
# grace was spent on such stubs at every stop).
KILL_MARKED = ('marked() { grep -lz -e "^FTC_SERVER_OF=${1//./[.]}/" /proc/[0-9]*/environ 2>/dev/null; }; '
               'kill_marked() { local f p i n last=-1 still=0; for ((i = 0; i < ${2:-0}; i++)); do '
               'n=$(marked "$1" | wc -l); (( n )) || return 0; '
               'if (( n == last )); then (( ++still < 5 )) || break; else last=$n; still=0; fi; '
               'sleep 0.1; done; marked "$1" | while IFS= read -r f; do p=${f#/proc/}; kill -KILL "${p%/environ}" '
               '2>/dev/null; done; }; ')
# A node's teardown after the servers: $1 the run id, $2 its /dev/shm prefix, then the python
# backend's /tmp folders it left.
NODE_TEARDOWN = KILL_MARKED + 'kill_marked "$1" "$2"; rm -rf -- "$3"*; set -- "$1" "${@:4}"; ' + FREE_PYTHON_ENVS
# The guard of a job that runs beside its launcher (local, ssh + Docker), where no scheduler
# ends a job's processes with it: bash in a session of its own, reading a pipe that only the
# supervisor holds. At its end without the supervisor's "done" (its teardown ran) -- the
# supervisor SIGKILLed, by hand or by the OOM killer -- it kills what is left of the job's
# session (a session's id is not reused while anything is in it: it names the job's processes),
# then what a node's teardown removes, with no grace: the ranks' marked processes, their
# /dev/shm entries and their marks in the python backend's folders. $1 the job's session id
# ("": the job leads none, as a job script run by hand from a terminal: the marks alone), $2
# Open MPI's folder of the run, $3 the run id, $4 its /dev/shm prefix.
SESSION_GUARD = ('read -r word; [[ $word != "done" ]] || exit 0; [[ -z $1 ]] || pkill -KILL -s "$1"; '
                 + KILL_MARKED + 'kill_marked "$3" 0; [[ -z $2 ]] || rm -rf -- "$2"; [[ -z $4 ]] || rm -rf -- "$4"*; '
                 + UNMARK_PYTHON_ENVS + '; shopt -s nullglob; unmark_python_envs /tmp/python_env_*/".ftc+$3+r"*')


# Pyxis's first step in the image (the MPI check, a job step or the servers) creates the named
# containers. Each of its tasks first records its / ("dev:inode") in $1/NODE.root, then runs
# the step's command: a / that is the node's own means the step did not run in the image.
PROVE_IN_IMAGE = ('stat -Lc "%d:%i" / >"$1/${SLURMD_NODENAME:-$(hostname -s)}.root" || exit 1; '
                  'shift; exec "$@"')
