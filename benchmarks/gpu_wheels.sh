#!/usr/bin/env bash
# Wheels for benchmarks/gpu_run.sh on a GPU machine without network access whose python3 (3.12)
# already has torch, pytorch-lightning and numpy: what else the GPU rows import, without their
# dependencies' resolution (which would pull a CUDA torch). Run where there is a network:
#     bash benchmarks/gpu_wheels.sh [.wheels] [3.12]
set -euo pipefail
dest=${1:-.wheels}
py=${2:-3.12}
mkdir -p "$dest"
pip download --quiet --dest "$dest" --python-version "$py" --only-binary=:all: --no-deps \
    gymnasium farama-notifications cloudpickle typing-extensions \
    ale-py envpool dm-env absl-py dm-tree optree types-protobuf protobuf attrs wrapt \
    opencv-python-headless stable-baselines3 pandas python-dateutil pytz tzdata six \
    matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing packaging
ls "$dest"
