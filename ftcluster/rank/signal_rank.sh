#!/bin/bash
# signal_rank.sh SIGNAL PIDFILE [group]: signal the rank wrapper that PIDFILE records ("PID START",
# written by rank_server.sh), only while PID still names that process (the same start time, field
# 22 of /proc/PID/stat): a pid alone may name another process by now. With "group", its process
# group, also once the number names no process: a group's id is not reused while it has members,
# so only the wrapper's own descendants are reached then (ftcluster/run/procs.py, the same rule).
set -u
sig=$1 pidfile=$2 group=${3:-}
read -r pid start _ <"$pidfile" 2>/dev/null || exit 1
[[ $pid =~ ^[0-9]+$ && $start =~ ^[0-9]+$ ]] || exit 1
now=
if read -r stat <"/proc/$pid/stat" 2>/dev/null; then
  read -ra fields <<<"${stat##*) }"
  [[ ${fields[0]} == [ZX] ]] || now=${fields[19]}
fi
if [ -n "$group" ]; then
  [ -z "$now" ] || [ "$now" = "$start" ] || exit 1
  kill "-$sig" -- "-$pid" 2>/dev/null
else
  [ "$now" = "$start" ] || exit 1
  kill "-$sig" "$pid" 2>/dev/null
fi
