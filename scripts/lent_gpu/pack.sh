#!/usr/bin/env bash
# Exported weights, held-out episodes (RGB + skeleton + metadata) and logs → $OUT, ≤ 15 MiB pieces.
cd "${WORKDIR:-/tmp/work}" || exit 1
tar cf /tmp/weights.tar weights/synthetic 2>/dev/null
(cd data/synthetic/heldout && tar cf /tmp/heldout.tar --exclude=depth.npz --exclude=flow.npz \
   --exclude=operator_stream.npz --exclude='*.tmp' .)
tar czf "$OUT/logs.tgz" out runs/synthetic/*/logs data/synthetic/*/summary.json 2>/dev/null
split -b 15M -d /tmp/weights.tar "$OUT/weights.tar."
[ -n "${NO_HELDOUT:-}" ] || split -b 15M -d /tmp/heldout.tar "$OUT/heldout.tar."
ls -la "$OUT"
