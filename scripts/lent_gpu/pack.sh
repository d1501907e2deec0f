#!/usr/bin/env bash
# What the lease has finished → $OUT as ≤ 15 MiB pieces, on every poll, so a machine taken back
# mid-lease loses only the work since the last call (`cat weights.tar.* | tar x` to unpack):
#   logs.tgz      always;
#   heldout.tar.* the held-out episodes (RGB + skeleton + metadata), once (unless NO_HELDOUT);
#   weights.tar.* weights/synthetic/<net> for each network this lease changed: the chain's exports once
#                 it has ended; before that, when a training run has a checkpoint newer than the last
#                 packed one, its EMA exported to interim/ (teacher, distilled student), and each
#                 network whose stage has ended (chain.sh's "finished NET": autoencoder, autoencoder4d,
#                 the decoders), as many whole networks as fit in what the call returns (the rest
#                 next call);
#   eval.tar.*    eval/ (the eval4d stage's metrics, reports, plots, the first episode's frame strip per
#                 task; no videos) whenever a metrics.json is new;
#   policy.tar.*  out/policy without the videos (success table, trials.jsonl, 6-frame strips), whenever
#                 its table has changed;
#   policy_weights.tar.* each policy export (runs/policy_<name>/export) of ≤ POLICY_PACK_MB (default 32)
#                 once finished (the SPEC-size CNN's, ≈ 170 MB in float32, stays on the machine).
cd "${WORKDIR:-/tmp/work}" || exit 1
REPO=${REPO:-/tmp/repo}
export PYTHONPATH=/tmp/site:$REPO XLA_PYTHON_CLIENT_PREALLOCATE=false
tar czf "$OUT/logs.tgz" --exclude=out/policy out runs/synthetic/*/logs runs/policy_*/logs data/synthetic/*/summary.json \
  data/sim/summary.json 2>/dev/null
if [ out/policy/success.json -nt .policy_packed ]; then
  touch .policy_packed && tar cf /tmp/policy.tar --exclude='*.mp4' out/policy &&
    split -b 15M -d /tmp/policy.tar "$OUT/policy.tar." && echo "packed out/policy: $(du -sh /tmp/policy.tar | cut -f1)"
fi
pols=()
for d in runs/policy_*/export; do
  n=${d%/export}; n=${n#runs/}  # complete once chain.sh has logged its size
  grep -q "${n#policy_}: $d (" out/chain.log 2>/dev/null && [ ! -e ".packed_$n" ] || continue
  [ "$(du -sm "$d" | cut -f1)" -le "${POLICY_PACK_MB:-32}" ] && pols+=("$d") && touch ".packed_$n" ||
    { echo "$d: $(du -sm "$d" | cut -f1) MB, over POLICY_PACK_MB: left on the machine"; touch ".packed_$n"; }
done
[ ${#pols[@]} -eq 0 ] || { tar cf /tmp/policy_weights.tar "${pols[@]}" &&
  split -b 15M -d /tmp/policy_weights.tar "$OUT/policy_weights.tar." && echo "packed ${pols[*]}"; }
if [ -d eval ] && [ -n "$(find eval -name metrics.json -newer .eval_packed 2>/dev/null || ls eval/*/metrics.json 2>/dev/null)" ]; then
  # frame strips of the first episode per task only (one each is ≈ 0.5 MB at 128×224)
  touch .eval_packed && tar cf /tmp/eval.tar --exclude='*.mp4' --exclude='*.npz' --exclude=strips eval &&
    { ls eval/*/strips/*episode_000000*.png > /dev/null 2>&1 && tar rf /tmp/eval.tar eval/*/strips/*episode_000000*.png || true; } &&
    split -b 15M -d /tmp/eval.tar "$OUT/eval.tar." && echo "packed eval/: $(du -sh /tmp/eval.tar | cut -f1)"
fi
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
  # networks whose stage has ended (chain.sh logs "finished NET" once weights/synthetic/NET is whole)
  for net in $(sed -n 's/.*\] finished \(.*\)$/\1/p' out/chain.log 2>/dev/null); do
    if changed "weights/synthetic/$net" && ! diff -rq "weights/synthetic/$net" "$src/$net" > /dev/null 2>&1; then
      mkdir -p "$src" && rm -rf "$src/$net" && cp -r "weights/synthetic/$net" "$src/" && new=1
    fi
  done
fi
digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum | md5sum | cut -c1-32); }
nets=()
if [ -n "$new" ]; then
  for d in "$src"/*; do
    n=$(basename "$d")
    # RynnWorld-4D's first two stages stay on the machine, unless the lease ended there (chain.sh's
    # "finished world4d_stage1": a later lease carries it in and runs stages 2–3)
    case $n in world4d_stage[12]|world4d_stage[12]_*) grep -q "\] finished $n\$" out/chain.log 2>/dev/null || continue ;; esac
    # a network is sent once per content: a call returns at most 8 × 16 MiB
    changed "$d" && [ "$(cat ".sent_$n" 2>/dev/null)" != "$(digest "$d")" ] && nets+=("$n")
  done
fi
# what fits beside the other pieces of this call (a call returns 8 files, 64 MiB together; PACK_MIB for
# tests); the rest is sent by the next call, since only what was packed is marked sent
room=$(( ${PACK_MIB:-64} * 1048576 - $(du -sb "$OUT" | cut -f1) - 1048576 )) slots=$(( 8 - $(ls "$OUT" | wc -l) ))
fit=() size=0
for n in "${nets[@]}"; do
  s=$(( $(du -sb "$src/$n" | cut -f1) + 65536 ))  # + tar headers
  if [ $(( size + s )) -le "$room" ] && [ $(( (size + s + 15728639) / 15728640 )) -le "$slots" ]; then
    fit+=("$n") size=$(( size + s ))
  else echo "not packed in this call (over what a call returns): $n; the next call sends it"; fi
done
nets=("${fit[@]}")
if [ ${#nets[@]} -gt 0 ]; then
  tar cf /tmp/weights.tar --transform "s|^|weights/synthetic/|" -C "$src" "${nets[@]}" &&
    rm -f "$OUT"/weights.tar.* && split -b 15M -d /tmp/weights.tar "$OUT/weights.tar." &&
    for n in "${nets[@]}"; do digest "$src/$n" > ".sent_$n"; done &&
    echo "packed weights: ${nets[*]} (from $src)"
  [ "$(ls "$OUT" | wc -l)" -le 8 ] || echo "WARNING: $(ls "$OUT" | wc -l) files in \$OUT: a call returns 8"
fi
ls -la "$OUT"
