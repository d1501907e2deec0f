#!/usr/bin/env bash
# What the lease has finished → $OUT as ≤ 15 MiB pieces, on every poll, so a machine taken back
# mid-lease loses only the work since the last call (`cat weights.tar.* | tar x` to unpack):
#   logs.tgz      always;
#   heldout.tar.* the held-out episodes (RGB + skeleton + metadata), once (unless NO_HELDOUT);
#   weights.tar.* weights/synthetic/<net> for each network this lease changed: the chain's exports once
#                 it has ended; before that, when a training run has a checkpoint newer than the last
#                 packed one, its EMA exported to interim/ (teacher, distilled student), with the
#                 autoencoder as its stage left it.
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
interim() {  # interim NET RUN MODULE ARGS...: RUN's newest checkpoint (a copy: the trainer keeps 2 and
             # may delete this one meanwhile) exported by MODULE to interim/weights/synthetic/NET
  local net=$1 run=$2 step; shift 2
  step=$(ls "$run" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
  [ -n "$step" ] && [ "$step" != "$(cat ".packed_$net" 2>/dev/null)" ] || return 1
  rm -rf "interim/ckpt_$net" "interim/weights/synthetic/$net" && mkdir -p "interim/ckpt_$net" interim/weights/synthetic &&
    cp -r "$run/$step" "interim/ckpt_$net/" &&
    python3 -m "$@" --set "ckpt.dir=interim/ckpt_$net" --out "interim/weights/synthetic/$net" --dtype bfloat16 \
      > "out/interim_$net.log" 2>&1 &&
    echo "$step" > ".packed_$net" && echo "interim $net export: step $step"
}
new=
if grep -q ALLDONE out/chain.log 2>/dev/null; then
  src=weights/synthetic new=1
else
  src=interim/weights/synthetic
  interim teacher runs/synthetic/teacher rynn_jax.training.export_weights --config "$REPO/configs/synthetic_teacher.py" && new=1
  interim student runs/synthetic/distill_b/ckpt rynn_jax.distill.export --config "$REPO/configs/synthetic_distill.py:dmd" \
    --resolution 128x224 && new=1
  if changed weights/synthetic/autoencoder && ! diff -rq weights/synthetic/autoencoder "$src/autoencoder" > /dev/null 2>&1; then
    mkdir -p "$src" && rm -rf "$src/autoencoder" && cp -r weights/synthetic/autoencoder "$src/" && new=1
  fi
fi
nets=()
if [ -n "$new" ]; then for d in "$src"/*; do changed "$d" && nets+=("$(basename "$d")"); done; fi
if [ ${#nets[@]} -gt 0 ]; then
  tar cf /tmp/weights.tar --transform "s|^|weights/synthetic/|" -C "$src" "${nets[@]}" &&
    rm -f "$OUT"/weights.tar.* && split -b 15M -d /tmp/weights.tar "$OUT/weights.tar." &&
    echo "packed weights: ${nets[*]} (from $src)"
fi
ls -la "$OUT"
