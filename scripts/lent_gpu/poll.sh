#!/usr/bin/env bash
# Later calls: wait up to WAIT seconds for the chain to end, show the logs; pack when it has ended
# (or PACK=1). `--now`: no wait, no pack.
WORKDIR=${WORKDIR:-/tmp/work}
. scripts/lent_gpu/deliver.sh && deliver "$(pwd)"  # committed weights this call's tree carries
if [ "${1:-}" != --now ]; then
  end=$(( $(date +%s) + ${WAIT:-540} ))
  while [ "$(date +%s)" -lt $end ] && ! grep -q ALLDONE "$WORKDIR/out/chain.log"; do sleep 5; done
fi
cat "$WORKDIR/out/chain.log"
for f in "$WORKDIR"/out/*.log; do [ "$f" = "$WORKDIR/out/chain.log" ] || { echo "== $f"; tail -c "${TAILC:-600}" "$f"; echo; }; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
[ "${1:-}" = --now ] && exit 0
if grep -q ALLDONE "$WORKDIR/out/chain.log" || [ -n "${PACK:-}" ]; then bash /tmp/repo/scripts/lent_gpu/pack.sh; fi
