#!/usr/bin/env bash
# What the lease has finished → $OUT as ≤ 15 MiB pieces, on every poll, so a machine taken back
# mid-lease loses only the work since the last call (`cat weights.tar.* | tar x` to unpack):
#   logs.tgz      always;
#   heldout.tar.* the held-out episodes (RGB + skeleton + metadata), once (unless NO_HELDOUT);
#   weights.tar.* weights/synthetic/<net> for each network this lease changed: the chain's exports once
#                 it has ended, else the newest teacher checkpoint's EMA exported to interim/ (when a
#                 step newer than the last packed one exists) with the autoencoder as it stands.
cd "${WORKDIR:-/tmp/work}" || exit 1
REPO=${REPO:-/tmp/repo}
export PYTHONPATH=/tmp/site:$REPO XLA_PYTHON_CLIENT_PREALLOCATE=false
tar czf "$OUT/logs.tgz" out runs/synthetic/*/logs data/synthetic/*/summary.json 2>/dev/null
if [ -z "${NO_HELDOUT:-}" ] && [ ! -e .heldout_packed ] && grep -q "held-out:" out/chain.log 2>/dev/null; then
  (cd data/synthetic/heldout && tar cf /tmp/heldout.tar --exclude=depth.npz --exclude=flow.npz \
     --exclude=operator_stream.npz --exclude='*.tmp' .) &&
    split -b 15M -d /tmp/heldout.tar "$OUT/heldout.tar." && touch .heldout_packed
fi
changed() {  # changed DIR: DIR/<net> differs from the committed init/<net> (or none was delivered)
  [ -f "$1/config.json" ] && ! diff -rq "$1" "init/$(basename "$1")" > /dev/null 2>&1
}
src=weights/synthetic
if ! grep -q ALLDONE out/chain.log 2>/dev/null; then
  step=$(ls runs/synthetic/teacher 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
  if [ -n "$step" ] && [ "$step" != "$(cat .packed_step 2>/dev/null)" ]; then
    # a copy first: the trainer keeps 2 checkpoints and may delete this one while it is exported
    rm -rf interim && mkdir -p interim/ckpt interim/weights/synthetic &&
      cp -r "runs/synthetic/teacher/$step" interim/ckpt/ &&
      python3 -m rynn_jax.training.export_weights --config "$REPO/configs/synthetic_teacher.py" \
        --set ckpt.dir=interim/ckpt --out interim/weights/synthetic/teacher --dtype bfloat16 > out/interim_export.log 2>&1 &&
      echo "$step" > .packed_step && echo "interim teacher export: step $step"
    [ -e weights/synthetic/autoencoder ] && cp -r weights/synthetic/autoencoder interim/weights/synthetic/
    src=interim/weights/synthetic
  elif [ -n "$step" ]; then
    src=
  fi
fi
nets=()
if [ -n "$src" ]; then for d in "$src"/*; do changed "$d" && nets+=("$(basename "$d")"); done; fi
if [ ${#nets[@]} -gt 0 ]; then
  tar cf /tmp/weights.tar --transform "s|^|weights/synthetic/|" -C "$src" "${nets[@]}" &&
    rm -f "$OUT"/weights.tar.* && split -b 15M -d /tmp/weights.tar "$OUT/weights.tar." &&
    echo "packed weights: ${nets[*]} (from $src)"
fi
ls -la "$OUT"
