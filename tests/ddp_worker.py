"""Run by tests/test_ddp.py in a subprocess: 2-rank CPU DDP (gloo); each rank dumps what it saw.

    python tests/ddp_worker.py OUT_DIR MODE

MODE ``check``: a few iterations of PPO CartPole (with an adaptive KL coefficient);
``learn``: the 100k-step learning run; ``uneven``: an env whose episodes end on rank 0 only
(its settings given as env_kwargs); ``spaces``: PPO on a Dict observation with MultiDiscrete actions;
``dqn``, ``dqn_uneven`` (the configuration where "enough data" used to differ between ranks),
``dqn_frames`` (DQN on stacked uint8 frames, stored once per step in a replay that wraps),
``apex_frames`` (APEX on them, a worker per rank shipping packets of frames to a packed replay),
``sac``, ``td3``, ``a2c``, ``impala``, ``appo``, ``apex``: the other algorithms (the async ones with a
sampler worker per rank); ``resume-ALGO-PHASE`` (ALGO ``ppo``/``dqn``/``apex``/``ma_ppo``/``td3``, PHASE
``full``: 8192 global env steps, ``first``: the first 4096 then a checkpoint in OUT_DIR,
``second``: resume from that checkpoint to 8192); ``envpool``: PPO CartPole on envpool's envs
(``vectorization="envpool"``), each rank its own pool.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_rl import A2C, APEX, APPO, DQN, IMPALA, PPO, SAC, TD3
from tests.image_envs import BrightSide, stacked_bright_side
from tests.multi_agent_envs import RankRelay, by_agent
from tests.space_envs import CueMatch

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def affinity() -> list[int]:
    """The CPUs this thread may run on (all of them where the OS has no affinity API)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


class RankEnv(gym.Env):
    """Episodes of 3 steps when seeded for rank 0, never-ending (no episode) on rank 1; observation
    ``step_size * t``, reward ``reward`` (given as env_kwargs by ``uneven``, so both ranks show them)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step_size: float = 0.1, reward: float = 1.0):
        self.step_size, self.reward = step_size, reward

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.limit = 3 if seed < 1000 else None
        self.t = 0
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.limit is not None and self.t >= self.limit
        return np.full(2, self.step_size * self.t, dtype=np.float32), self.reward, done, False, {}


def stored_obs(buffer) -> list:
    """The first stored observations (or frames, where the replay stores frames) of a buffer."""
    state = buffer.state_dict()
    return state["obs" if "obs" in state else "frames"][:4].reshape(-1).tolist()


class Recorder(pl.Callback):
    def __init__(self) -> None:
        self.learner_stats: list[dict] = []
        self.first_obs = None
        self.buffer_obs = None
        self.affinity = None
        self.kl_coeff = None
        self.rows = 0  # the default policy's batch rows this rank trained on

    def on_train_end(self, trainer, pl_module):
        buffer = getattr(pl_module.active_datamodule, "buffer", None)
        if buffer is not None:
            self.buffer_obs = stored_obs(buffer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.affinity = affinity()
        for one in getattr(batch, "batches", [batch]):  # an IterationStream's iterations (iterations_per_step)
            self.record_batch(one)
        stats = outputs["learner_info"].get("default_policy", {}).get("learner_stats", {})
        self.learner_stats.append({k: v for k, v in stats.items() if isinstance(v, float)})
        kl_coeff = getattr(pl_module, "kl_coeff", {})  # PPO's adapts per policy; APPO's is a constant
        self.kl_coeff = dict(kl_coeff) if isinstance(kl_coeff, dict) else kl_coeff

    def record_batch(self, batch):
        if self.first_obs is None and batch.policy_batches:  # the default policy's, or the first one's
            policy_batch = batch.policy_batches.get("default_policy") or next(iter(batch.policy_batches.values()))
            self.first_obs = policy_batch["obs"][:4].tolist()
        elif self.first_obs is None and batch.replay is not None:
            replay = batch.replay
            buffer = replay.buffer if hasattr(replay, "buffer") else replay.buffers["p_runner"]  # multi-agent
            self.first_obs = stored_obs(buffer)
        if "default_policy" in batch.policy_batches:
            self.rows += batch.policy_batches["default_policy"].count


RESUME = {
    "ppo": (PPO, dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64,
                      num_sgd_iter=2, kl_coeff=0.2, iterations_per_epoch=8)),
    "dqn": (DQN, dict(env="CartPole-v1", num_envs=2, learning_starts=256, train_freq=32, num_gradient_steps=4,
                      train_batch_size=32, buffer_size=3000, hiddens=(32,), prioritized_replay=True,
                      target_network_update_freq=256, iterations_per_epoch=16)),
    # multi-agent: each rank's PettingZoo envs (plain data) resume mid-episode; the helper joins on rank 0 only
    "ma_ppo": (PPO, dict(env=RankRelay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=4,
                         rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=2, hiddens=(16,),
                         iterations_per_epoch=8)),
    # sampling in the learner process (num_workers=0): each rank's envs, replay and n-step windows resume
    "apex": (APEX, dict(env="CartPole-v1", num_workers=0, num_envs=4, rollout_fragment_length=16,
                        learning_starts=256, num_gradient_steps=4, train_batch_size=32, buffer_size=3000,
                        hiddens=(32,), target_network_update_freq=512, iterations_per_epoch=16)),
    # each rank's replay, envs and Ornstein-Uhlenbeck process resume; the actor steps every 2nd update
    "td3": (TD3, dict(env="Pendulum-v1", num_envs=4, learning_starts=256, train_freq=32, num_gradient_steps=4,
                      train_batch_size=32, buffer_size=3000, hiddens=(32,), action_noise="ornstein-uhlenbeck",
                      iterations_per_epoch=8)),
}


def main(out: Path, mode: str) -> None:
    torch.set_num_threads(1)
    affinity_before = affinity()
    common = dict(seed=0, iterations_per_epoch=5)
    trainer_kwargs = {}
    ckpt_path = None
    if mode == "learn":
        model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, num_sgd_iter=20,
                    sgd_minibatch_size=128, lr=1e-3, lr_schedule="linear", clip_param_schedule="linear",
                    gamma=0.98, lambda_=0.8, total_env_steps=100_000, evaluation_interval=2,
                    evaluation_num_episodes=5, **common)
    elif mode == "dqn":
        model = DQN(env="CartPole-v1", learning_starts=64, train_freq=32, num_gradient_steps=4, train_batch_size=32,
                    buffer_size=2000, hiddens=(32,), prioritized_replay=True, total_env_steps=2 * 32 * 8,
                    target_network_update_freq=64, **common)
    elif mode == "dqn_frames":  # (4, 16, 16) uint8 stacks, one frame per step in a 24-row ring that wraps
        model = DQN(env=stacked_bright_side, num_envs=2, learning_starts=32, train_freq=16, num_gradient_steps=2,
                    train_batch_size=16, buffer_size=48, hiddens=(16,), total_env_steps=2 * 32 * 6,
                    target_network_update_freq=64, vectorization="sync", **common)
    elif mode == "dqn_uneven":
        model = DQN(env="CartPole-v1", num_envs=4, train_freq=16, num_gradient_steps=1, learning_starts=65,
                    train_batch_size=114, buffer_size=2000, hiddens=(16,), total_env_steps=2 * 64 * 12, **common)
    elif mode in ("sac", "sac_streamed"):  # sac_streamed: 4 iterations (env steps) per Lightning step
        model = SAC(env="Pendulum-v1", learning_starts=32, train_batch_size=32, hiddens=(16,),
                    total_env_steps=2 * 48, prioritized_replay=True, **common,
                    **({"iterations_per_step": 4} if mode == "sac_streamed" else {}))
    elif mode == "td3":  # Ornstein-Uhlenbeck noise: each rank's process is its own
        model = TD3(env="Pendulum-v1", learning_starts=32, train_batch_size=32, hiddens=(16,),
                    total_env_steps=2 * 48, prioritized_replay=True, action_noise="ornstein-uhlenbeck", **common)
    elif mode in ("a2c", "a2c_one_per_step"):  # a2c: A2C's 10 iterations_per_step, here 5 (the epoch's), then 1
        model = A2C(env="CartPole-v1", num_envs=4, total_env_steps=2 * 4 * 5 * 6, **common,
                    **({"iterations_per_step": 1} if mode == "a2c_one_per_step" else {}))
    elif mode in ("impala", "appo"):  # each rank forks its own sampler worker
        model = {"impala": IMPALA, "appo": APPO}[mode](
            env="CartPole-v1", num_workers=1, num_envs=2, rollout_fragment_length=10, train_batch_size=40,
            hiddens=(16,), total_env_steps=2 * 40 * 6, sampler_timeout_s=60.0, **common)
    elif mode == "apex":  # each rank's worker inserts one 20-step fragment per iteration into its own replay
        model = APEX(env="CartPole-v1", num_workers=1, num_envs=2, rollout_fragment_length=10, hiddens=(16,),
                     learning_starts=40, num_gradient_steps=2, train_batch_size=16, target_network_update_freq=64,
                     total_env_steps=2 * 20 * 8, sampler_timeout_s=60.0, **common)
    elif mode == "apex_frames":  # (4, 16, 16) stacks: each rank's worker ships packets of frames to its packed replay
        model = APEX(env=stacked_bright_side, num_workers=1, num_envs=2, rollout_fragment_length=8, hiddens=(16,),
                     learning_starts=32, num_gradient_steps=2, train_batch_size=16, target_network_update_freq=64,
                     buffer_size=48, total_env_steps=2 * 16 * 8, sampler_timeout_s=60.0, **common)
    elif mode.startswith("multi_agent"):  # rank 1's envs never see the helper: its policy has rows on rank 0 only
        if mode == "multi_agent_impala":  # a sampler worker per rank; rank 1's helper columns are all invalid
            model = IMPALA(env=RankRelay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent,
                           num_workers=1, num_envs=2, rollout_fragment_length=10, train_batch_size=20,
                           hiddens=(16,), total_env_steps=2 * 20 * 4, sampler_timeout_s=60.0, **common)
        elif mode == "multi_agent_dqn":  # per-policy replay: rank 1 steps p_helper on weight-0 placeholders
            model = DQN(env=RankRelay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                        train_freq=10, learning_starts=20, num_gradient_steps=2, train_batch_size=8, buffer_size=200,
                        hiddens=(16,), target_network_update_freq=40, total_env_steps=2 * 20 * 4, **common)
        else:
            model = PPO(env=RankRelay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                        rollout_fragment_length=10, sgd_minibatch_size=8, num_sgd_iter=2, hiddens=(16,),
                        total_env_steps=2 * 20 * 4, **common)
    elif mode == "lstm":  # recurrent PPO: whole-sequence minibatches, the same count on both ranks
        model = PPO(env="CartPole-v1", use_lstm=True, max_seq_len=8, lstm_cell_size=16, hiddens=(16,), num_envs=2,
                    rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2, total_env_steps=2 * 32 * 4,
                    vectorization="sync", **common)
    elif mode == "lstm_impala":  # recurrent IMPALA: fragment columns as sequences, from the recorded state
        model = IMPALA(env="CartPole-v1", use_lstm=True, max_seq_len=4, lstm_cell_size=16, hiddens=(16,),
                       num_workers=0, num_envs=2, rollout_fragment_length=8, train_batch_size=16,
                       total_env_steps=2 * 16 * 4, vectorization="sync", **common)
    elif mode == "normalize":  # observation and reward statistics merged over both ranks' batches; a user encoder
        model = PPO(env="CartPole-v1", normalize_observations=True, normalize_rewards=True, num_envs=2,
                    encoder="tests.test_custom_network.TwoLayerEncoder",
                    rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2, total_env_steps=2 * 32 * 4,
                    **common)
    elif mode == "pixels":  # uint8 image observations, the default CNN (IMPALA's for 16x16 frames), in bf16-mixed
        model = PPO(env=BrightSide, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2,
                    hiddens=(), vf_share_layers=True, total_env_steps=2 * 32 * 3, vectorization="sync", **common)
        trainer_kwargs["precision"] = "bf16-mixed"
    elif mode == "spaces":  # Dict observations (flattened at the envs), MultiDiscrete actions with a start
        model = PPO(env=CueMatch, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2,
                    hiddens=(16,), total_env_steps=2 * 32 * 3, vectorization="sync", **common)
    elif mode == "envpool":  # each rank builds its own envpool, seeded seed + 1000 * rank
        model = PPO(env="CartPole-v1", vectorization="envpool", num_envs=2, rollout_fragment_length=16,
                    sgd_minibatch_size=16, num_sgd_iter=2, hiddens=(16,), total_env_steps=2 * 32 * 3, **common)
    elif mode == "uneven":
        model = PPO(env=RankEnv, env_kwargs={"step_size": 0.2, "reward": 2.0},
                    num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8,
                    total_env_steps=4 * 32, vectorization="sync", **common)
    elif mode.startswith("resume-"):
        _, algo, phase = mode.split("-")
        cls, kwargs = RESUME[algo]
        model = cls(**kwargs, seed=0, total_env_steps=8192)
        if phase == "first":
            trainer_kwargs["max_epochs"] = 2  # 2 epochs of 8 (ppo) or 16 (dqn, apex) iterations: 4096 global env steps
        elif phase == "second":
            ckpt_path = out / "half.ckpt"
    else:  # "check", and "compile": the same run with compiled update steps ("compile-functional":
        # with the graphs CUDA uses, which return the new state instead of writing it)
        if mode == "compile-functional":
            from lightning_rl.update import UpdateStep
            UpdateStep.functional = True
        model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=16, sgd_minibatch_size=32,
                    num_sgd_iter=3, total_env_steps=4 * 2 * 64, kl_coeff=0.2, kl_target=1e-4,
                    compile=mode.startswith("compile"), **common)
    recorder = Recorder()
    trainer = pl.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", logger=CSVLogger(out, name="csv"), log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder],
        **trainer_kwargs,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    if mode.endswith("-first"):
        trainer.save_checkpoint(out / "half.ckpt")  # every rank takes part: each one's sampler state is gathered
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    dm_state = model.default_datamodule.state_dict()  # kept at teardown, gathered over ranks
    # async sampling keeps its learner-process sampler's state under "local" (none of its workers')
    ranks = dm_state.get("ranks") or (dm_state.get("local") or {}).get("ranks") or []
    for r in ranks:  # a multi-agent sampler keeps {agent: observation} per env
        if not isinstance(r.get("obs"), torch.Tensor):
            r["obs"] = torch.cat([o[a].flatten().float() for o in r["obs"] for a in sorted(o)])
    last_obs = ranks[trainer.global_rank]["obs"].tolist() if trainer.global_rank == 0 and ranks else None
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
        "buffer_obs": recorder.buffer_obs,
        "replay_frame_stack": getattr(model.default_datamodule, "frame_stack", None),
        "affinity_before": affinity_before,
        "affinity_during": recorder.affinity,
        "affinity_after": affinity(),
        "params": params.tolist(),
        "param_names": [name for name, _ in model.named_parameters()],
        "buffers": {name: b.double().flatten().tolist() for name, b in model.named_buffers()},
        "rows": recorder.rows,
        "first_obs": recorder.first_obs,
        "last_obs_rank0": last_obs,
        "last_obs_all": [r["obs"].tolist() for r in ranks] if ranks else None,
        "counters": model.counters,
        "global_counters": model.global_counters,
        "learner_stats": recorder.learner_stats,
        "kl_coeff": recorder.kl_coeff,
        "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
