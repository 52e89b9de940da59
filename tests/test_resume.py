"""Exact resume: fit 2k env steps -> checkpoint -> resume to 4k equals an uninterrupted 4k run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from lightning_rl import DQN, PPO, SAC
from lightning_rl.checkpoint import CheckpointError
from tests.conftest import quiet_trainer

PPO_KW = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=2,
              seed=0, iterations_per_epoch=4, total_env_steps=None)
DQN_KW = dict(env="CartPole-v1", seed=0, learning_starts=256, train_freq=32, num_gradient_steps=8,
              train_batch_size=32, buffer_size=5000, hiddens=(32,), iterations_per_epoch=16, total_env_steps=None,
              prioritized_replay=True, target_network_update_freq=256)


def weights(model) -> torch.Tensor:
    return torch.cat([t.detach().flatten().float() for t in model.state_dict().values()])


def straight_and_resumed(cls, kwargs, tmp_path, epochs=(4, 8)):
    straight = cls(**kwargs)
    quiet_trainer(max_epochs=epochs[1]).fit(straight)

    first = cls(**kwargs)
    trainer = quiet_trainer(max_epochs=epochs[0])
    trainer.fit(first)
    path = tmp_path / "half.ckpt"
    trainer.save_checkpoint(path)
    resumed = cls(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "envs were reset" warning on this path
        warnings.filterwarnings("ignore", message="(?!the checkpoint holds)")
        trainer = quiet_trainer(max_epochs=epochs[1])
        trainer.fit(resumed, ckpt_path=path)
    return straight, resumed, trainer


@pytest.mark.parametrize("vectorization", ["auto", "sync"])  # CartPole's own vector env, and gymnasium's sync one
def test_ppo_resume_is_exact(tmp_path, vectorization):
    straight, resumed, _ = straight_and_resumed(PPO, {**PPO_KW, "vectorization": vectorization}, tmp_path)
    assert resumed.counters == straight.counters and straight.counters["num_env_steps_sampled"] == 4096
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)


def test_dqn_resume_is_exact_with_replay_buffer(tmp_path):
    straight, resumed, _ = straight_and_resumed(DQN, DQN_KW, tmp_path, epochs=(4, 8))
    assert resumed.counters == straight.counters and straight.counters["num_env_steps_sampled"] == 4096
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
    # the DataModule keeps its last state at teardown, for the one rank of this run
    a, b = (m.default_datamodule.state_dict()["ranks"][0]["buffer"] for m in (straight, resumed))
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key  # the same transitions and priorities


def test_dqn_checkpoint_carries_the_buffer_only_when_asked(tmp_path):
    model = DQN(**DQN_KW)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    with_buffer = tmp_path / "with.ckpt"
    trainer.save_checkpoint(with_buffer)
    state = torch.load(with_buffer, weights_only=True)["lightning_rl"]["datamodule"]["ranks"][0]
    assert state["buffer"] is not None and state["env_steps"] == 512

    model = DQN(**{**DQN_KW, "checkpoint_replay_buffer": False})
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    without = tmp_path / "without.ckpt"
    trainer.save_checkpoint(without)
    assert torch.load(without, weights_only=True)["lightning_rl"]["datamodule"]["ranks"][0]["buffer"] is None
    assert without.stat().st_size < with_buffer.stat().st_size


@pytest.mark.timeout(180)
def test_envs_in_other_processes_warn_and_continue_with_counters(tmp_path):
    kwargs = {**PPO_KW, "vectorization": "async", "num_envs": 2}
    model = PPO(**kwargs)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    path = tmp_path / "async.ckpt"
    trainer.save_checkpoint(path)
    resumed = PPO(**kwargs)
    with pytest.warns(UserWarning, match="holds no env state.*AsyncVectorEnv.*envs were reset"):
        quiet_trainer(max_epochs=2).fit(resumed, ckpt_path=path)
    assert resumed.counters["num_env_steps_sampled"] == 2 * 4 * 2 * 32
    assert resumed.counters["num_iterations"] == 8


def test_checkpoints_load_with_weights_only(tmp_path):
    for cls, kw in ((PPO, PPO_KW), (DQN, DQN_KW), (SAC, dict(seed=0, learning_starts=32, iterations_per_epoch=40,
                                                              total_env_steps=None, hiddens=(16,)))):
        model = cls(**kw)
        trainer = quiet_trainer(max_epochs=1)
        trainer.fit(model)
        trainer.save_checkpoint(tmp_path / "m.ckpt")
        checkpoint = torch.load(tmp_path / "m.ckpt", weights_only=True)
        name = cls.__name__
        assert checkpoint["lightning_rl"]["algorithm"] == f"lightning_rl.algorithms.{name.lower()}.{name}"
        restored = cls.load_from_checkpoint(tmp_path / "m.ckpt", weights_only=True)
        assert restored.counters == model.counters


@pytest.fixture
def good_checkpoint(tmp_path):
    model = PPO(**PPO_KW)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    path = tmp_path / "good.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_truncated_checkpoint_names_the_file(tmp_path, good_checkpoint):
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(good_checkpoint.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match=r"checkpoint '.*truncated\.ckpt' is corrupt or truncated"):
        quiet_trainer(max_epochs=2).fit(PPO(**PPO_KW), ckpt_path=bad)


def test_garbage_checkpoint_names_the_file(tmp_path):
    bad = tmp_path / "garbage.ckpt"
    bad.write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(CheckpointError, match=r"garbage\.ckpt' is corrupt or truncated"):
        quiet_trainer(max_epochs=2).fit(PPO(**PPO_KW), ckpt_path=bad)


def test_missing_checkpoint_names_the_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"nothere\.ckpt' does not exist"):
        quiet_trainer(max_epochs=2).fit(PPO(**PPO_KW), ckpt_path=tmp_path / "nothere.ckpt")


def test_foreign_checkpoints_name_the_file(tmp_path, good_checkpoint):
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "epoch": 0}, plain)
    with pytest.raises(CheckpointError, match=r"plain\.ckpt' was not written by lightning_rl"):
        quiet_trainer(max_epochs=2).fit(PPO(**PPO_KW), ckpt_path=plain)
    with pytest.raises(CheckpointError, match=r"good\.ckpt' was written by lightning_rl.algorithms.ppo.PPO, not .*DQN"):
        quiet_trainer(max_epochs=2).fit(DQN(**DQN_KW), ckpt_path=good_checkpoint)
    with pytest.raises(CheckpointError, match=r"good\.ckpt' does not fit this PPO: parameters differ"):
        quiet_trainer(max_epochs=2).fit(PPO(**{**PPO_KW, "hiddens": (8,), "vf_share_layers": True}),
                                        ckpt_path=good_checkpoint)


def test_sac_is_reproducible_whatever_the_global_rng():
    """SAC's update samples actions; its noise comes from the seeded learner generator, not from
    torch's global RNG (which the seed does not reach)."""
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        model = SAC(seed=0, learning_starts=32, train_batch_size=32, hiddens=(16,), total_env_steps=None,
                    iterations_per_epoch=60)
        quiet_trainer(max_epochs=1).fit(model)
        runs.append(weights(model))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_sac_resume_is_exact(tmp_path):
    kwargs = dict(seed=0, learning_starts=32, train_batch_size=32, hiddens=(16,), total_env_steps=None,
                  iterations_per_epoch=40)
    straight, resumed, _ = straight_and_resumed(SAC, kwargs, tmp_path, epochs=(1, 2))
    assert resumed.counters == straight.counters
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
