#!/usr/bin/env bash
# The synthetic-world world model, end to end: data → autoencoder → pre-encoded latents → teacher →
# exported bf16 weights → distilled causal student (phase A, phase B, export). Every stage is one of
# the project's own commands; re-running a stage resumes it (episodes, shards and checkpoints are
# written atomically). Paths and sizes: configs/synthetic.py.
#
#   scripts/synthetic_world_model.sh all                 # every stage, in order
#   scripts/synthetic_world_model.sh data heldout text   # some stages
#   scripts/synthetic_world_model.sh preencode4d world4d eval4d   # RynnWorld-4D on top (docs/RYNNWORLD4D.md)
#
# Knobs (environment): WORKERS (sim processes, default nproc), N_TRAIN / N_HELDOUT (episodes per task,
# default from configs/synthetic.py), PREENCODE_WORKERS (processes sharing the accelerator, default 4),
# AE_STEPS / TEACHER_STEPS (override total_steps), TEACHER_SECONDS (stop the teacher after this many
# seconds with SIGINT: it saves and exits), DISTILL_A_SECONDS / DISTILL_B_SECONDS (the same for the two
# distillation phases), DISTILL_A_STEPS / DISTILL_B_STEPS (override total_steps), STUDENT_INIT (an
# exported student phase B continues from, instead of phase A's run), CONFIG_SUFFIX ("_tiny" for the
# CPU smoke run, e.g. configs/synthetic_ae_tiny.py), RES (HxW, default 128x224), FRAMES (episode length),
# DATA_SEED (first training seed, default TRAIN_SEED; a run that regenerates its data — a lent GPU
# lease — can take fresh episodes with another, e.g. 100000 × n, as long as its attempts stay below
# HELDOUT_SEED). RynnWorld-4D: VARIANT (joint, default; independent: the no-joint-attention ablation;
# control: the skeleton-driven extension, its own three stages),
# WORLD4D_SECONDS / WORLD4D_STEPS (per stage, as for the teacher), WORLD4D_STAGES (which of 1 2 3 run;
# a stage reads the previous one's export, so "2 3" needs weights/synthetic/world4d_stage1).
# WORKDIR: where data/, weights/ and runs/ go (default: the repository).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "${WORKDIR:-$REPO}"
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
# configs/synthetic.py's constants and the RynnWorld-4D export folders (this VARIANT's), read in one
# Python start (each costs ≈ 2 s of imports)
consts=$($PY -c "
import shlex
from configs import synthetic as s, world4d_synthetic as w
names = ('HEIGHT WIDTH TRAIN_PER_TASK HELDOUT_PER_TASK DATA_TRAIN DATA_HELDOUT TEXT_EMBEDDINGS LATENTS AUTOENCODER '
         'AUTOENCODER_4D TEACHER STUDENT LATENTS_4D TRAIN_SEED HELDOUT_SEED TEXT_DIM TEXT_LEN CLIP_FRAMES CLIP_STRIDE')
print('declare -A C=(' + ' '.join(f'[{n}]={shlex.quote(str(getattr(s, n)))}' for n in names.split()) + ')')
print('W4D=(' + ' '.join(shlex.quote(w.export_dir(n, '${VARIANT:-joint}')) for n in (1, 2, 3)) + ')')")
eval "$consts"
const() { echo "${C[$1]}"; }

RES=${RES:-$(const HEIGHT)x$(const WIDTH)}
H=${RES%x*}; W=${RES#*x}
WORKERS=${WORKERS:-$(nproc)}
N_TRAIN=${N_TRAIN:-$(const TRAIN_PER_TASK)}
N_HELDOUT=${N_HELDOUT:-$(const HELDOUT_PER_TASK)}
TRAIN_DIR=$(const DATA_TRAIN); HELDOUT_DIR=$(const DATA_HELDOUT); TEXT_DIR=$(const TEXT_EMBEDDINGS)
LATENT_DIR=$(dirname "$(const LATENTS)"); AE_DIR=$(const AUTOENCODER); SUFFIX=${CONFIG_SUFFIX:-}
AE4D_DIR=$(const AUTOENCODER_4D)
ae4d() { [ -f "$AE4D_DIR/config.json" ] && echo "$AE4D_DIR" || echo "$AE_DIR"; }  # 4D stages: the depth/flow-tuned one once trained
TEACHER_DIR=$(const TEACHER); STUDENT_DIR=$(const STUDENT); LATENT4D_DIR=$(dirname "$(const LATENTS_4D)")
FRAMES_ARG=${FRAMES:+--frames $FRAMES}
SIM_CACHE=${SIM_CACHE:-cache/sim_xla}  # the sim workers' shared compilation cache (held-out and training runs)
log() { echo "[$(date +%H:%M:%S)] $*"; }
limited() {         # limited SECONDS CMD...: CMD, stopped after SECONDS (if set) with SIGINT (it saves, exports
                    # and exits; killed KILL_AFTER seconds later if still running)
  local seconds=$1; shift
  if [ -n "$seconds" ]; then timeout --signal=INT --kill-after="${KILL_AFTER:-300}" "$seconds" "$@" || [ $? -eq 124 ]; else "$@"; fi
}

stage_data() {      # training episodes (the generator interleaves the tasks: a run cut short is balanced)
  local seed=${DATA_SEED:-$(const TRAIN_SEED)} heldout; heldout=$(const HELDOUT_SEED)
  if [ "$seed" -lt 0 ] || [ $((seed + 3 * N_TRAIN + 5)) -ge "$heldout" ]; then   # 3N + 5: the attempt limit
    echo "DATA_SEED=$seed: its attempts would reach the held-out seeds ($heldout and up)" >&2; exit 2
  fi
  log "data: $N_TRAIN per task from seed $seed"
  $PY -m rynn_jax.sim.cli generate --task all --n "$N_TRAIN" --seed "$seed" --out "$TRAIN_DIR" \
      --workers "$WORKERS" --resolution "$RES" $FRAMES_ARG --compile-cache "$SIM_CACHE" > /dev/null || true   # short tasks: logged in summary.json
}

stage_heldout() {
  log "held-out: $N_HELDOUT per task"
  $PY -m rynn_jax.sim.cli generate --task all --n "$N_HELDOUT" --seed "$(const HELDOUT_SEED)" \
      --out "$HELDOUT_DIR" --workers "$WORKERS" --resolution "$RES" $FRAMES_ARG --compile-cache "$SIM_CACHE" > /dev/null || true
}

stage_text() {      # one hashed context per task description (configs/synthetic.py: TEXT_DIM, TEXT_LEN)
  $PY -m rynn_jax.text --episodes "$TRAIN_DIR" --out "$TEXT_DIR" --dim "$(const TEXT_DIM)" --len "$(const TEXT_LEN)"
  $PY -m rynn_jax.text --episodes "$HELDOUT_DIR" --out "$TEXT_DIR" --dim "$(const TEXT_DIM)" --len "$(const TEXT_LEN)"
}

stage_autoencoder() {
  log "autoencoder"
  $PY "$REPO/train.py" --config "$REPO/configs/synthetic_ae${SUFFIX}.py" ${AE_STEPS:+--set total_steps=$AE_STEPS}
}

stage_autoencoder4d() {  # the committed autoencoder fine-tuned on depth and flow videos too (AE4D_VARIANT=frozen:
                         # its decoder only, the latents stay the RGB autoencoder's; configs/synthetic_ae4d.py)
  log "autoencoder4d ${AE4D_VARIANT:-}"
  limited "${AE4D_SECONDS:-}" $PY "$REPO/train.py" --config "$REPO/configs/synthetic_ae4d.py${AE4D_VARIANT:+:$AE4D_VARIANT}" \
      ${AE4D_STEPS:+--set total_steps=$AE4D_STEPS} ${AE4D_ARGS:-}
}

preencode() {       # preencode OUT [FLAGS]: PREENCODE_WORKERS processes share the accelerator (a memory slice each)
  local out=$1 n=${PREENCODE_WORKERS:-4} pids=(); shift
  log "preencode $*: $n workers"
  for ((i = 0; i < n; i++)); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN{print 0.8/$n}") \
    $PY -m rynn_jax.data.preencode --source robot --root "$TRAIN_DIR" --out "$out" --vae "${VAE_DIR:-$AE_DIR}" \
        --text-embeddings "$TEXT_DIR" --text-dim "$(const TEXT_DIM)" --text-len "$(const TEXT_LEN)" \
        --frames "${CLIP_FRAMES:-$(const CLIP_FRAMES)}" --stride "${CLIP_STRIDE:-$(const CLIP_STRIDE)}" \
        --height "$H" --width "$W" --records-per-shard 64 --worker "$i" --num-workers "$n" "$@" > /dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
stage_preencode() { preencode "$LATENT_DIR"; }
stage_preencode4d() { VAE_DIR=$(ae4d) preencode "$LATENT4D_DIR" --geometry; }   # the same clips + depth and flow latents

stage_teacher() {
  log "teacher"
  limited "${TEACHER_SECONDS:-}" $PY "$REPO/train.py" --config "$REPO/configs/synthetic_teacher${SUFFIX}.py" \
      ${TEACHER_STEPS:+--set total_steps=$TEACHER_STEPS}
}

stage_export() {    # EMA weights, bf16, where the loaders and the demo look for them
  log "export"
  $PY -m rynn_jax.training.export_weights --config "$REPO/configs/synthetic_teacher${SUFFIX}.py" \
      --out "$TEACHER_DIR" --dtype bfloat16
}

DISTILL=$REPO/configs/synthetic_distill${SUFFIX}.py
stage_distill_a() { # phase A (causal warm-up) from the exported teacher (the recipe's ckpt.init_from)
  [ -n "${STUDENT_INIT:-}" ] && { log "distill A: skipped (phase B continues from $STUDENT_INIT)"; return; }
  log "distill A"
  limited "${DISTILL_A_SECONDS:-}" $PY "$REPO/distill.py" --config "$DISTILL:warmup" \
      ${DISTILL_A_STEPS:+--set total_steps=$DISTILL_A_STEPS}
}

stage_distill_b() { # phase B (DMD) from phase A's newest checkpoint, or from STUDENT_INIT's exported weights
  log "distill B"
  limited "${DISTILL_B_SECONDS:-}" $PY "$REPO/distill.py" --config "$DISTILL:dmd" \
      ${STUDENT_INIT:+--set student_from=$STUDENT_INIT} ${DISTILL_B_STEPS:+--set total_steps=$DISTILL_B_STEPS}
}

stage_distill_export() { # EMA student, bf16, with its serving spec: what serve.py loads by default
  log "distill export"
  $PY -m rynn_jax.distill.export --config "$DISTILL:dmd" --out "$STUDENT_DIR" --dtype bfloat16 --resolution "$RES"
}

WORLD4D=$REPO/configs/world4d_synthetic${SUFFIX}.py
world4d_dir() { echo "${W4D[$(( $1 - 1 ))]}"; }
stage_world4d() {   # RynnWorld-4D's stages (WORLD4D_STAGES, default "1 2 3") from the exported teacher, each
                    # exported for the next (bf16); stage 1 (no joint attention) is shared by joint and independent:
                    # skipped when its export exists (made earlier, or carried in from another lease)
  local v=${VARIANT:-joint} out n
  for n in ${WORLD4D_STAGES:-1 2 3}; do
    case $n in 1|2|3) ;; *) echo "WORLD4D_STAGES: stages are 1, 2 and 3, got '$n'" >&2; exit 2 ;; esac
    out=$(world4d_dir "$n")
    if [ "$n" = 1 ] && [ -d "$out" ]; then log "world4d 1: $out exists"; continue; fi
    if [ "$n" != 1 ] && [ ! -f "$(world4d_dir $((n - 1)))/config.json" ]; then
      echo "world4d $n starts from stage $((n - 1))'s export, and $(world4d_dir $((n - 1))) has none" >&2; exit 2
    fi
    log "world4d $n ($v)"
    limited "${WORLD4D_SECONDS:-}" $PY "$REPO/train.py" --config "$WORLD4D:$n,$v" \
        ${WORLD4D_STEPS:+--set total_steps=$WORLD4D_STEPS}
    $PY -m rynn_jax.training.export_weights --config "$WORLD4D:$n,$v" --out "$out" --dtype bfloat16
  done
}

stage_eval4d() {    # the stage-3 model on the held-out episodes: RGB, depth (AbsRel, δ1), flow (EPE, px)
  log "eval4d (${VARIANT:-joint})"
  local swap=; [ "${VARIANT:-joint}" = control ] && swap=--swap   # skeleton-driven: the swapped-skeleton test too
  $PY "$REPO/eval.py" --model world4d --dit "$(world4d_dir 3)" --vae "$(ae4d)" --episodes "$HELDOUT_DIR" \
      --text-embeddings "$TEXT_DIR" --out "eval/world4d_${VARIANT:-joint}" --frames "${EVAL_FRAMES:-33}" --no-fvd $swap
}

stages=("$@")
[ "${stages[*]:-}" = all ] || [ ${#stages[@]} -eq 0 ] && stages=(data heldout text autoencoder preencode teacher export distill_a distill_b distill_export)
for s in "${stages[@]}"; do "stage_$s"; done
log "done: ${stages[*]}"
