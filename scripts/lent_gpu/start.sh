#!/usr/bin/env bash
# First call on the lent machine: install the carried dependencies, start chain.sh detached, report.
# PRE_BENCHES=<benches.sh's BENCHES>: time those on the still quiet card first (results under $OUT),
# stopped after PRE_BENCHES_SECONDS (default 360) so that the chain always starts within the call.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site MUJOCO_GL=egl PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export WORKDIR=${WORKDIR:-/tmp/work}
mkdir -p "$WORKDIR/out"
rm -rf /tmp/repo && cp -r . /tmp/repo && cd /tmp/repo
python3 -c "import jax, mujoco, grain, av; print('jax', jax.__version__, jax.devices(), 'mujoco', mujoco.__version__)"
[ -z "${PRE_BENCHES:-}" ] || BENCHES=$PRE_BENCHES timeout "${PRE_BENCHES_SECONDS:-360}" bash scripts/lent_gpu/benches.sh
setsid nohup bash scripts/lent_gpu/chain.sh > "$WORKDIR/out/chain.log" 2>&1 < /dev/null &
sleep "${WAIT:-240}"
bash scripts/lent_gpu/poll.sh --now
