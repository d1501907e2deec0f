#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) and EGL loader packages the lent GPU machine lacks, into the ignored
# folders .whl/ and .gl/ of the repository (≈ 54 MB together; ftfy + wcwidth: the umT5 tokenizer, which
# the live server imports).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .gl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  mujoco==4.0.0 mujoco-core==4.0.0 glfw==2.11.0 PyOpenGL==3.1.10 grain==0.2.18 array_record==0.8.6 \
  portpicker av==18.1.0 tensorboardX==2.6.5 ftfy wcwidth
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
mkdir -p /tmp/amd64/partial
apt-get $o update -qq
(cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
du -sh .whl .gl
