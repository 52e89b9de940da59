"""Static tools see every setting (issue 37): the settings are typed dataclass fields, so
``mypy`` on a user's script flags a misspelt setting and a value of the wrong type, and accepts
each algorithm made with its own settings. One mypy run checks every case (its cache in a
temporary folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRONG = """\
PPO(env="CartPole-v1", gama=0.9)
PPO(env="CartPole-v1", lr="fast")
DQN(env="CartPole-v1", num_envz=4)
"""

RIGHT = """\
PPO(env="CartPole-v1", lr=1e-3, gamma=0.98)
PPO("CartPole-v1", num_envs=4, clip_param=0.1, use_lstm=True)
A2C(env="CartPole-v1", lr=7e-4, optimizer="adam", rollout_fragment_length=5)
A3C(env="CartPole-v1", num_workers=0, lambda_=1.0, optimizer="rmsprop")
APEX(env="CartPole-v1", num_workers=1, training_intensity=8.0, epsilon=0.4)
APPO(env="CartPole-v1", use_kl_loss=True, kl_coeff=0.5, learner_queue_size=8)
DQN(env="CartPole-v1", double_q=False, buffer_size=50_000, hiddens=(64, 64))
IMPALA(env="CartPole-v1", num_workers=2, vtrace_clip_rho_threshold=None, train_batch_size=400)
SAC(env="Pendulum-v1", initial_alpha=0.5, target_entropy="auto", tau=0.01)
TD3(env="Pendulum-v1", policy_delay=2, action_noise=None, twin_q=True)
DDPG(env="Pendulum-v1", action_noise_sigma=0.2, lr_schedule="linear", seed=0)
model = PPO(env="CartPole-v1")
gamma: float = model.gamma
"""


def test_mypy_flags_misspelt_and_mistyped_settings_and_accepts_the_right_ones(tmp_path):
    header = "from lightning_rl import A2C, A3C, APEX, APPO, DDPG, DQN, IMPALA, PPO, SAC, TD3\n\n"
    script = tmp_path / "user_script.py"
    script.write_text(header + WRONG + RIGHT)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
         "--cache-dir", str(tmp_path / "mypy_cache"), "--hide-error-context", "--no-pretty", script.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    report = textwrap.indent(proc.stdout + proc.stderr, "  ")
    errors = [re.match(r"^(.*):(\d+): error: (.*)$", line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1 and all(m.group(1) == script.name for m in errors if m), report
    lines = {int(m.group(2)) - 2: m.group(3) for m in errors if m}  # the script's lines after the import
    assert sorted(lines) == [1, 2, 3], report  # the three wrong calls only
    assert lines[1].startswith('Unexpected keyword argument "gama" for "PPO"')
    assert lines[2].startswith('Argument "lr" to "PPO" has incompatible type "str"; expected "float"')
    assert lines[3].startswith('Unexpected keyword argument "num_envz" for "DQN"')
