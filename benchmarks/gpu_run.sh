#!/usr/bin/env bash
# Issue 36's GPU rows in one run of under 10 minutes, on a machine without network access:
# the wheels from benchmarks/gpu_wheels.sh installed from ./.wheels, then each step under its
# own time limit, its output in $OUT/<step>.txt and its exit status in $OUT/summary.txt.
#
#   update:   µs per update, eager against compiled (CUDA graphs), PPO CartPole and the Nature
#             CNN's PPO update, with the count of "skipping cudagraphs" lines (0 = captured)
#   cartpole: PPO CartPole with the learner on the GPU against the CPU (benchmarks/gpu_check.py)
#   atari:    Atari PPO on the GPU, ours (envpool, bf16, compiled) against SB3 (SubprocVecEnv)
#
#     OUT=gpu_out bash benchmarks/gpu_run.sh
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -d .wheels ]; then
    python3 -m pip install --quiet --no-index --find-links .wheels --no-deps .wheels/*.whl >"$OUT/pip.txt" 2>&1
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    setsid timeout -k 10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "$name rc=$? $((SECONDS - start)) s: $*" >>"$OUT/summary.txt"
}
step update 170 python3 benchmarks/update_step.py --device cuda --algos ppo,atari_ppo --calls 50 --repeats 3
step cartpole 120 python3 benchmarks/gpu_check.py --algos ppo_cartpole_rlzoo --iterations 40
step atari 240 python3 benchmarks/atari.py --device cuda --algos ppo --seeds 1 --ppo-steps 16384 \
    --vectorizations envpool,async --precisions bf16-mixed --compile true --sb3-vec subproc --env-only-steps 200
cat "$OUT/summary.txt"
