#!/usr/bin/env bash
# Stop the chain's running training stage now: SIGINT to the train.py / distill.py runs working in
# WORKDIR (only those: a trainer elsewhere on the machine is not touched), which save, export and
# exit as at their time limit, and the chain goes on to its next stage. poll.sh runs this after
# STOP_AFTER seconds of its call, e.g. to leave a short lease room for the export.
WORKDIR=${WORKDIR:-/tmp/work}
dir=$(cd "$WORKDIR" && pwd -P) || exit 1
n=0
for pid in $(pgrep -f '(train|distill)\.py --config'); do
  [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$dir" ] || continue
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)
  case "${cmd%% *}" in *python*) ;; *) continue ;; esac  # the run itself, not its `timeout` wrapper
  kill -INT "$pid" 2>/dev/null && n=$((n + 1)) && echo "[stop] SIGINT to $pid: ${cmd:0:120}"
done
echo "[stop] $n training run(s) asked to stop"
