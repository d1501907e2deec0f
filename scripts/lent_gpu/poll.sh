#!/usr/bin/env bash
# Later calls: wait up to WAIT seconds for the chain to end, show the logs, pack what has finished
# (pack.sh: every call, so a machine taken back loses only this call's work). `--now`: no wait, no pack.
# STOP_AFTER=N: N seconds into the wait, stop the running training stage (stop.sh: SIGINT, it saves
# and exports), so the call can still bring its export back.
WORKDIR=${WORKDIR:-/tmp/work}
. scripts/lent_gpu/deliver.sh && deliver "$(pwd)"  # committed weights this call's tree carries
if [ "${1:-}" != --now ]; then
  stopper=
  [ -z "${STOP_AFTER:-}" ] || { ( sleep "$STOP_AFTER"; WORKDIR=$WORKDIR bash scripts/lent_gpu/stop.sh ) & stopper=$!; }
  end=$(( $(date +%s) + ${WAIT:-540} ))
  while [ "$(date +%s)" -lt $end ] && ! grep -q ALLDONE "$WORKDIR/out/chain.log"; do sleep 5; done
  [ -z "$stopper" ] || kill "$stopper" 2>/dev/null  # the chain ended first: nothing left to stop
fi
cat "$WORKDIR/out/chain.log"
for f in "$WORKDIR"/out/*.log; do [ "$f" = "$WORKDIR/out/chain.log" ] || { echo "== $f"; tail -c "${TAILC:-600}" "$f"; echo; }; done
[ -f "$WORKDIR/out/policy/success.md" ] && cat "$WORKDIR/out/policy/success.md"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
[ "${1:-}" = --now ] && exit 0
bash /tmp/repo/scripts/lent_gpu/pack.sh
