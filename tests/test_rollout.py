"""RolloutDataModule: envs from ids or factories, per-env seeds, episodes, one batch per step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import PPO, MultiAgentBatch, RolloutDataModule, SampleBatch
from lightning_rl.data.rollout import rank_seed
from lightning_rl.data.settings import EnvSettings
from tests.conftest import fit_iterations, quiet_trainer
from tests.test_truncation import time_limited


def connected(model, env="CartPole-v1", rollout_fragment_length=8, **kwargs) -> RolloutDataModule:
    dm = RolloutDataModule(EnvSettings(env, **{"num_envs": 4, "seed": 0, **kwargs}), rollout_fragment_length)
    dm.connect(model)
    dm.setup("fit")
    return dm


@pytest.fixture
def model():
    return PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0,
               total_env_steps=None)


def test_batch_columns_and_counts(model):
    dm = connected(model)
    batch = dm.sample()
    assert isinstance(batch, MultiAgentBatch) and batch.env_steps == 32
    fragment = batch.policy_batches["default_policy"]  # time-major, as docs/design.md states
    for col in ("obs", "actions", "action_logp", "vf_preds", "rewards", "terminateds", "truncateds", "valid"):
        assert fragment[col].shape[:2] == (8, 4), col
    assert fragment["bootstrap_obs"].shape == (4, 4)
    assert np.array_equal(fragment["bootstrap_obs"].numpy(), dm.sampler.obs)
    assert "advantages" not in fragment  # the sampler computes no targets: the learner does
    assert not any(torch.is_inference(v) for v in fragment.values())  # autograd may use the batch
    pb = model.postprocess(batch).policy_batches["default_policy"]
    for col in ("obs", "actions", "action_logp", "vf_preds", "rewards", "terminateds", "truncateds",
                "advantages", "value_targets"):
        assert pb[col].shape[0] == pb.count == int(fragment["valid"].sum()), col
    assert pb["obs"].shape[1:] == (4,)
    assert not {"valid", "bootstrap_obs"} & set(pb)
    dm.teardown("fit")


def test_sampling_runs_under_inference_mode(model):
    modes = []
    policy = model.policies["default_policy"]
    original = policy.compute_actions

    def spy(*args, **kwargs):
        modes.append(torch.is_inference_mode_enabled())
        return original(*args, **kwargs)

    policy.compute_actions = spy
    connected(model).sample()
    assert modes == [True] * 8


def test_action_logp_matches_the_policy(model):
    pb = model.postprocess(connected(model).sample()).policy_batches["default_policy"]
    with torch.no_grad():
        dist, values = model.policies["default_policy"](pb["obs"])
    torch.testing.assert_close(dist.log_prob(pb["actions"]), pb["action_logp"])
    torch.testing.assert_close(values, pb["vf_preds"])


def test_each_env_gets_its_own_seed(model):
    first = connected(model).sampler.obs
    assert len({tuple(row) for row in first.round(6)}) == 4
    np.testing.assert_array_equal(first, connected(model).sampler.obs)  # same seed, same starts
    assert not np.array_equal(first, connected(model, seed=1).sampler.obs)


def test_rank_seeds_are_distinct():
    assert [rank_seed(7, r) for r in range(3)] == [7, 1007, 2007]
    assert rank_seed(None, 1) is None


def test_same_seed_same_rollout(model):
    a = connected(model).sample().policy_batches["default_policy"]
    b = connected(model).sample().policy_batches["default_policy"]
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_episode_returns_and_lengths_recorded():
    model = PPO(env=time_limited, num_envs=2, rollout_fragment_length=12, sgd_minibatch_size=8, seed=0,
                total_env_steps=None)
    dm = connected(model, env=time_limited, num_envs=2, rollout_fragment_length=12)
    info = dm.sample().info
    assert info["episode_returns"] == [5.0] * 4 and info["episode_lengths"] == [5] * 4
    assert info["sample_time_s"] > 0
    assert dm.sample().info["episode_returns"] == [5.0] * 4  # only new episodes each time


def test_env_factory_and_continuous_actions_are_clipped():
    seen = []

    class Recorder(gym.ActionWrapper):
        def action(self, action):
            seen.append(np.asarray(action).copy())
            return action

    def factory():
        return Recorder(gym.make("Pendulum-v1"))

    model = PPO(env=factory, num_envs=2, rollout_fragment_length=64, sgd_minibatch_size=8, seed=0,
                log_std_init=2.0, total_env_steps=None)
    pb = connected(model, env=factory, num_envs=2, rollout_fragment_length=64).sample().policy_batches[
        "default_policy"]
    assert np.abs(np.concatenate(seen)).max() <= 2.0  # the env only sees actions within bounds
    assert pb["actions"].abs().max() > 2.0  # the batch keeps the sampled ones (exact log-probs)


@pytest.mark.timeout(120)
def test_async_vector_env_trains():
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0,
                vectorization="async", total_env_steps=None)
    fit_iterations(model, 2)
    assert model.counters["num_env_steps_sampled"] == 64


def test_default_vectorization_uses_the_env_vector_entry_point(model):
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    assert isinstance(connected(model).envs.unwrapped, CartPoleVectorEnv)
    assert isinstance(connected(model, vectorization="sync").envs.unwrapped, gym.vector.SyncVectorEnv)


def test_one_batch_per_training_step_and_epoch_length():
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0,
                iterations_per_epoch=3, total_env_steps=None)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(model)
    assert model.counters["num_iterations"] == 6 and trainer.current_epoch == 2
    assert model.counters["num_env_steps_sampled"] == 6 * 32


def test_total_env_steps_stops_fit():
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0,
                iterations_per_epoch=2, total_env_steps=100)
    quiet_trainer().fit(model)
    assert model.counters["num_env_steps_sampled"] == 128  # the first iteration at or past 100


def test_explicit_datamodule_is_used():
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0,
                total_env_steps=None)
    dm = RolloutDataModule(EnvSettings("CartPole-v1", num_envs=3, iterations_per_epoch=2), rollout_fragment_length=4)
    quiet_trainer(max_epochs=1).fit(model, datamodule=dm)
    assert model.counters["num_env_steps_sampled"] == 2 * 12


def test_compute_actions_numpy_single_and_batched(model):
    obs = np.zeros((5, 4), dtype=np.float32)
    actions = model.compute_actions(obs, explore=False)
    assert isinstance(actions, np.ndarray) and actions.shape == (5,)
    single = model.compute_actions(obs[0], explore=False)
    assert single.shape == () and single == actions[0]
    assert torch.is_tensor(model.compute_actions(torch.zeros(2, 4), policy_id="default_policy"))


def test_checkpoint_keeps_counters(tmp_path, model):
    trainer = fit_iterations(model, 2, default_root_dir=tmp_path)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    restored = PPO.load_from_checkpoint(path, weights_only=False)
    assert restored.counters == model.counters and restored.counters["num_iterations"] == 2
    assert all(isinstance(v, int) for v in restored.counters.values())
    assert torch.equal(restored.policies["default_policy"].pi_head.weight,
                       model.policies["default_policy"].pi_head.weight)
    assert restored.kl_coeff == model.kl_coeff and SampleBatch.OBS == "obs"


@pytest.mark.parametrize("mode", ["sync", "vector_entry_point"])
def test_episode_statistics_match_gymnasiums_record_episode_statistics(mode):
    """Our lean wrapper keeps the same episode counts, returns and lengths as gymnasium's
    ``vector.RecordEpisodeStatistics`` under next-step autoreset, partial resets included."""
    import gymnasium as gym

    from lightning_rl.data.envs import EpisodeStatistics, make_vector_env

    ours = make_vector_env("CartPole-v1", 4, mode)
    assert isinstance(ours, EpisodeStatistics)
    theirs = gym.wrappers.vector.RecordEpisodeStatistics(make_vector_env("CartPole-v1", 4, mode).env,
                                                         buffer_length=100_000)
    rng = np.random.default_rng(0)
    for envs in (ours, theirs):
        envs.reset(seed=3)
    for t in range(600):
        actions = rng.integers(0, 2, size=4)
        out_ours, out_theirs = ours.step(actions), theirs.step(actions)
        np.testing.assert_array_equal(out_ours[1], out_theirs[1])
        if t == 300:  # restart every env mid-episode
            for envs in (ours, theirs):
                envs.reset(seed=7)
    assert ours.episode_count == theirs.episode_count > 20
    assert list(ours.return_queue) == list(theirs.return_queue)
    assert list(ours.length_queue) == list(theirs.length_queue)
    np.testing.assert_array_equal(ours.episode_returns, theirs.episode_returns)
    # A partial reset restarts only the masked envs' episodes. (gymnasium's wrapper restarts
    # all of them over SyncVectorEnv, which pops the mask before the wrapper reads it.)
    ours.step(np.zeros(4, dtype=np.int64))
    before = ours.episode_returns.copy()
    ours.reset(seed=9, options={"reset_mask": np.array([True, False, True, False])})
    np.testing.assert_array_equal(ours.episode_returns, [0.0, before[1], 0.0, before[3]])
    ours.close()
    theirs.close()


class _Watched:
    """The module as the DataModule sees it, recording every attribute the sampler reads."""

    def __init__(self, module) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._module, name)


@pytest.mark.parametrize("use_lstm", [False, True])
def test_sampling_asks_the_module_for_actions_only_and_the_learner_computes_the_targets(use_lstm):
    """Data flows one way (docs/design.md): a fragment needs only the acting policy (the network
    and its exploration settings, which the sampling engine asks for actions); GAE, its
    bootstrap value and the reset rows dropped are the training step's (``postprocess``)."""
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0,
                total_env_steps=None, use_lstm=use_lstm, max_seq_len=8, gamma=0.9, lambda_=0.8)
    dm = connected(model)
    watched = _Watched(model)
    dm.module = watched
    batch = dm.sample()
    assert watched.read <= {"sampling_policy", "exploration_kwargs"}, watched.read
    fragment = dict(batch.policy_batches["default_policy"])
    inputs = {k[len("bootstrap_"):]: v for k, v in fragment.items()
              if k.startswith("bootstrap_") and k != "bootstrap_obs"}
    assert bool(inputs) == use_lstm
    with torch.no_grad():
        bootstrap = model.policy.value(fragment["bootstrap_obs"], **inputs)
    # GAE by a plain loop over each env's column, from the value of the observation after the fragment
    rewards, values = fragment["rewards"], fragment["vf_preds"]
    ends = fragment["terminateds"] | fragment["truncateds"]
    advantages = torch.zeros(8, 4)
    for n in range(4):
        next_value, running = bootstrap[n], 0.0
        for t in reversed(range(8)):
            if ends[t, n]:
                running = 0.0
            delta = rewards[t, n] + 0.9 * next_value * (0.0 if fragment["terminateds"][t, n] else 1.0) - values[t, n]
            running = delta + 0.9 * 0.8 * running
            advantages[t, n], next_value = running, values[t, n]
    pb = model.postprocess(batch).policy_batches["default_policy"]
    if use_lstm:  # sequences of 8 steps of one env, the reset rows kept and masked
        expected = advantages.T.reshape(-1)
        torch.testing.assert_close(pb["mask"], fragment["valid"].T.reshape(-1).float())
    else:
        expected = advantages.reshape(-1)[fragment["valid"].reshape(-1)]
    torch.testing.assert_close(pb["advantages"], expected)
    dm.teardown("fit")


def test_a_datamodule_made_by_hand_checks_the_settings_it_is_given():
    """A DataModule takes the settings objects the algorithms are made of and runs their
    declarations' checks: one line naming the setting, as the algorithm would say it."""
    from lightning_rl.data import AsyncSamplingDataModule, LearnerQueue, SamplerWorkers

    with pytest.raises(ValueError, match=r"^num_envs must be >= 1, got 0$"):
        RolloutDataModule(EnvSettings("CartPole-v1", num_envs=0), rollout_fragment_length=8)
    with pytest.raises(ValueError, match=r"^num_workers must be >= 0, got -1$"):
        AsyncSamplingDataModule("CartPole-v1", 8, 64, SamplerWorkers(num_workers=-1))
    with pytest.raises(ValueError, match=r"^max_policy_lag must be >= 0 or None, got -2$"):
        AsyncSamplingDataModule("CartPole-v1", 8, 64, learner_queue=LearnerQueue(max_policy_lag=-2))
    dm = RolloutDataModule("CartPole-v1", rollout_fragment_length=8)  # an env alone: the settings' defaults
    assert dm.num_envs == EnvSettings().num_envs and dm.train_batch_size == 8 * dm.num_envs
