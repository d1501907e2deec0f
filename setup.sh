#!/usr/bin/env bash
# One-step setup on a fresh machine: the system library MuJoCo needs for headless rendering, then the
# Python packages.
#
#   ./setup.sh          # runtime: requirements.txt (the demo, training, serving)
#   ./setup.sh --test   # + test tools: requirements-test.txt (what CI runs), and Debian's chromium +
#                       # chromium-driver for the live page's browser tests (skipped without them)
#
# MuJoCo renders offscreen through OpenGL (the synthetic world, `serve.py demo --world sim`, replay
# videos). pip cannot install a GL driver, so this installs Mesa's software one (Debian/Ubuntu
# `libosmesa6`, used with MUJOCO_GL=osmesa) when no offscreen GL is present. Machines with an NVIDIA
# driver can use EGL instead (MUJOCO_GL=egl) and skip this step. Set PYTHON to pick the interpreter.
set -euo pipefail
cd "$(dirname "$0")"

requirements=requirements.txt
for arg in "$@"; do
  case "$arg" in
    --test) requirements=requirements-test.txt ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument $arg (use --test or nothing)" >&2; exit 2 ;;
  esac
done

have_osmesa() { ldconfig -p 2>/dev/null | grep -q 'libOSMesa\.so'; }

if have_osmesa; then
  echo "setup.sh: offscreen GL (libOSMesa) present"
elif command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "setup.sh: libosmesa6 is missing and installing it needs root: run 'apt-get install -y libosmesa6' as root" >&2
      exit 1
    fi
  fi
  echo "setup.sh: installing libosmesa6 (MuJoCo's headless renderer) with apt-get"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libosmesa6 >/dev/null
else
  echo "setup.sh: no apt-get here; install Mesa's OSMesa library with your package manager" \
       "(e.g. 'dnf install mesa-libOSMesa', 'brew' has none: use MUJOCO_GL=egl or glfw) and re-run" >&2
  exit 1
fi

"${PYTHON:-python3}" -m pip install -q -r "$requirements"
if [ "$requirements" = requirements-test.txt ]; then
  # The PyTorch LPIPS reference, without torchvision (requirements-test.txt says why).
  "${PYTHON:-python3}" -m pip install -q --no-deps lpips==0.1.4
  # libtpu, the TPU compiler for the ahead-of-time TPU compile tests (tests/test_aot.py, python -m
  # rynn_jax.aot): the wheel jax pins for its own version (~213 MB, a few seconds from the cache).
  jax_version=$("${PYTHON:-python3}" -c 'import jax; print(jax.__version__)')
  "${PYTHON:-python3}" -m pip install -q "jax[tpu]==${jax_version}"
  # Headless Chromium for tests/test_live.py's page tests (driven by selenium, loopback only).
  if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    if command -v apt-get >/dev/null 2>&1 && $sudo true 2>/dev/null; then
      echo "setup.sh: installing chromium + chromium-driver (the live page's browser tests) with apt-get"
      $sudo apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    else
      echo "setup.sh: no chromium + chromium-driver and no root apt-get: the live page's browser tests will skip" >&2
    fi
  fi
fi
echo "setup.sh: done (${requirements})"
