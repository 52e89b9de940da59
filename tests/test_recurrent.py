"""Recurrent policies (use_lstm): state through sampling, whole-sequence minibatches, exact
reproduction of the sampling forward in training, masking, resets at episode starts, resume."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import A2C, PPO
from lightning_rl.batch import SampleBatch
from lightning_rl.update import UpdateStep
from tests.conftest import fit_in_halves, quiet_trainer, sample_once


class Countdown(gym.Env):
    """Episodes of ``length`` steps; the observation is ``[steps left, 1]``."""

    def __init__(self, length: int = 5, render_mode: str | None = "rgb_array") -> None:
        self.metadata = {"render_modes": ["rgb_array"]}
        self.length, self.render_mode = length, render_mode
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.length, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.length - self.t, 1.0], dtype=np.float32)
        return obs, float(action), self.t >= self.length, False, {}

    def render(self):
        return np.full((8, 8, 3), 40 * self.t, dtype=np.uint8)


def default_batch(model) -> SampleBatch:
    return sample_once(model).policy_batches["default_policy"]


def lstm_ppo(**kwargs) -> PPO:
    settings = dict(env=Countdown, use_lstm=True, max_seq_len=4, num_envs=2, rollout_fragment_length=12,
                    sgd_minibatch_size=8, num_sgd_iter=2, hiddens=(16,), lstm_cell_size=8, total_env_steps=96, seed=0,
                    iterations_per_epoch=2, vectorization="sync")
    return PPO(**{**settings, **kwargs})


def test_sampling_resets_the_state_exactly_at_episode_starts():
    """Countdown(5) under next-step autoreset: per env, rows t = 0..4 are an episode, t = 5 the
    reset step, t = 6..10 the next episode, t = 11 a reset step. The state is zeroed at t = 0 and
    at the first step after each reset step (the reset step holds the ended episode's final
    observation and carries its state); the sampled outputs at those rows equal a zero state's,
    and elsewhere they need the carried state."""
    model = lstm_ppo()
    batch = default_batch(model)
    starts = batch["episode_starts"].reshape(-1, 4)  # sequences of 4, env after env within each chunk
    # sequence s = (chunk c, env n): rows t = 4c .. 4c + 3 of env n
    by_env = {n: torch.cat([starts[c * 2 + n] for c in range(3)]).tolist() for n in range(2)}
    expected = [True, False, False, False, False, False, True, False, False, False, False, False]
    assert by_env == {0: expected, 1: expected}
    policy = model.policies["default_policy"]
    with torch.no_grad():
        zero = policy.compute_actions(batch["obs"], explore=False, state_in=torch.zeros_like(batch["state_in"]),
                                      episode_starts=torch.zeros_like(batch["episode_starts"]))
        carried = policy.compute_actions(batch["obs"], explore=False, state_in=batch["state_in"],
                                         episode_starts=batch["episode_starts"])
    torch.testing.assert_close(carried["vf_preds"], batch["vf_preds"], rtol=1e-5, atol=1e-6)
    at_start = batch["episode_starts"]
    torch.testing.assert_close(zero["vf_preds"][at_start], batch["vf_preds"][at_start], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(zero["vf_preds"][~at_start], batch["vf_preds"][~at_start])


def test_the_training_forward_reproduces_the_sampled_log_probs_and_values_step_for_step():
    model = lstm_ppo(num_envs=3, rollout_fragment_length=16)
    batch = default_batch(model)
    num_seqs = batch["seq_lens"].numel()
    rows = (torch.arange(num_seqs)[None, :] * 4 + torch.arange(4)[:, None]).flatten()  # all sequences, time-major
    time_major = batch.select(rows)
    with torch.no_grad():
        dist, values = model.policy_forward("default_policy", time_major, None)
    torch.testing.assert_close(dist.log_prob(time_major["actions"]), time_major["action_logp"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, time_major["vf_preds"], rtol=1e-5, atol=1e-5)


def test_minibatches_are_whole_sequences_and_every_rank_takes_the_same_steps(monkeypatch):
    seen = []
    original = UpdateStep.__call__

    def record(self, batch, scalars=None):
        seen.append(batch)
        return original(self, batch, scalars)

    monkeypatch.setattr(UpdateStep, "__call__", record)
    model = lstm_ppo(num_envs=3, sgd_minibatch_size=16)  # 9 sequences of 4 -> 3 minibatches of 3 sequences
    quiet_trainer(max_epochs=1, limit_train_batches=1).fit(model)
    assert len(seen) == 2 * 3  # num_sgd_iter * ceil(36 / 16)
    for minibatch in seen:
        obs = minibatch["obs"].reshape(4, -1, 2)  # time-major [L, B]
        for b in range(obs.shape[1]):  # within a sequence the countdown advances (or an episode restarts)
            column, starts = obs[:, b, 0].tolist(), minibatch["episode_starts"].reshape(4, -1)[:, b].tolist()
            for t in range(1, 4):
                assert column[t] == column[t - 1] - 1 or starts[t]


def test_padding_and_masking_do_not_change_the_loss():
    model = lstm_ppo()
    batch = default_batch(model)
    batch["advantages"] = torch.linspace(-1, 1, batch.count)
    rows = (torch.tensor([0, 3])[None, :] * 4 + torch.arange(4)[:, None]).flatten()
    padded_rows = (torch.tensor([0, 3, 0])[None, :] * 4 + torch.arange(4)[:, None]).flatten()
    plain, padded = batch.select(rows), batch.select(padded_rows)
    padded["mask"] = padded["mask"] * torch.tensor([1.0, 1.0, 0.0]).repeat(4)
    loss, _ = model.loss("default_policy", plain)
    loss_padded, _ = model.loss("default_policy", padded)
    torch.testing.assert_close(loss, loss_padded, rtol=1e-6, atol=1e-7)
    # the reset rows carry mask 0: changing their advantages changes nothing
    reset = plain["mask"] == 0
    assert reset.any()
    changed = plain.select(torch.arange(plain.count))
    changed["advantages"] = torch.where(reset, torch.full_like(changed["advantages"], 1e3), changed["advantages"])
    torch.testing.assert_close(model.loss("default_policy", changed)[0], loss, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_recurrent_resume_is_bit_exact(algo, tmp_path):
    kwargs = dict(env=Countdown, use_lstm=True, max_seq_len=4, num_envs=2, rollout_fragment_length=12, seed=0,
                  hiddens=(16,), lstm_cell_size=8, total_env_steps=10**6, iterations_per_epoch=2,
                  vectorization="sync", lstm_use_prev_action=True, lstm_use_prev_reward=True)
    if algo is PPO:
        kwargs.update(sgd_minibatch_size=8, num_sgd_iter=2)
    full, _, resumed = fit_in_halves(lambda: algo(**kwargs), tmp_path, batches=2)
    assert resumed.counters == full.counters
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_bad_recurrent_settings_are_clear_errors():
    with pytest.raises(ValueError, match=r"max_seq_len \(16\) is larger than sgd_minibatch_size \(8\)"):
        lstm_ppo(max_seq_len=16, rollout_fragment_length=16)
    with pytest.raises(ValueError, match=r"max_seq_len \(5\) must divide rollout_fragment_length \(12\)"):
        lstm_ppo(max_seq_len=5)


def test_previous_action_and_reward_inputs_change_the_policy():
    base = lstm_ppo()
    with_prev = lstm_ppo(lstm_use_prev_action=True, lstm_use_prev_reward=True)
    n_base = sum(p.numel() for p in base.parameters())
    n_prev = sum(p.numel() for p in with_prev.parameters())
    assert n_prev - n_base == 2 * 4 * 8 * (2 + 1)  # two LSTMs, 4 gates of 8, inputs: one-hot action (2) + reward


def test_predict_carries_the_state_like_recurrent_ppo_and_evaluate_and_record_work(tmp_path):
    from lightning_rl import evaluate
    from lightning_rl.recording import record

    model = lstm_ppo()
    quiet_trainer(max_epochs=1, limit_train_batches=1, default_root_dir=tmp_path).fit(model)
    obs = np.array([[5.0, 1.0], [3.0, 1.0]], dtype=np.float32)
    actions, state = model.predict(obs, state=None, episode_start=np.ones(2, dtype=bool), deterministic=True)
    assert actions.shape == (2,) and state.shape == (2, model.policies["default_policy"].state_size)
    _, state2 = model.predict(obs, state=state, episode_start=np.zeros(2, dtype=bool), deterministic=True)
    assert not np.allclose(state, state2)  # the state moved on
    one, one_state = model.predict(obs[0], state=state[0], episode_start=np.zeros(1, dtype=bool), deterministic=True)
    assert np.ndim(one) == 0 and one_state.shape == state2[0].shape
    np.testing.assert_allclose(one_state, state2[0], rtol=1e-5, atol=1e-6)
    # episode_start zeroes the state: equal to starting from None
    _, fresh_state = model.predict(obs, state=state2, episode_start=np.ones(2, dtype=bool), deterministic=True)
    np.testing.assert_allclose(fresh_state, model.predict(obs, None, np.ones(2, dtype=bool), True)[1], rtol=1e-6)
    returns = evaluate(model, num_episodes=3, seed=0)
    assert len(returns) == 3 and all(0 <= r <= 5 for r in returns)
    gif_returns = record(model, tmp_path / "lstm.gif", num_episodes=1, seed=0, env=Countdown)
    assert len(gif_returns) == 1
    with pytest.raises(ValueError, match="predict does not know the previous action and reward"):
        lstm_ppo(lstm_use_prev_action=True).predict(obs, None, np.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="a recurrent one needs its state"):
        model.export_policy(tmp_path / "policy.pt")


def lstm_impala(algo=None, **kwargs):
    from lightning_rl import IMPALA

    settings = dict(env=Countdown, use_lstm=True, num_workers=0, num_envs=2, rollout_fragment_length=8,
                    train_batch_size=16, hiddens=(16,), lstm_cell_size=8, total_env_steps=10**6, seed=0,
                    iterations_per_epoch=2, vectorization="sync", sampler_timeout_s=30.0)
    return (algo or IMPALA)(**{**settings, **kwargs})


@pytest.mark.parametrize("workers", [0, 1])
def test_impala_columns_are_sequences_whose_forward_reproduces_sampling_and_its_bootstrap_step(workers):
    from tests.test_async import children
    from tests.test_env_faults import live_pids

    model = lstm_impala(num_workers=workers, lstm_use_prev_action=True, lstm_use_prev_reward=True)
    processes = set(children())
    batch = default_batch(model)
    assert not live_pids([p for p in children() if p not in processes], grace_s=3.0)  # the worker is gone
    assert batch["state_in"].shape == (8, 2, model.policies["default_policy"].state_size)
    with torch.no_grad():
        _, logp, values, bootstrap_value, _ = model.time_major_forward("default_policy", batch, None)
        following = model.policies["default_policy"].compute_actions(
            batch["bootstrap_obs"], explore=False, state_in=batch["bootstrap_state_in"],
            episode_starts=batch["bootstrap_episode_starts"], prev_actions=batch["bootstrap_prev_actions"],
            prev_rewards=batch["bootstrap_prev_rewards"])
    torch.testing.assert_close(logp, batch["action_logp"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, batch["vf_preds"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bootstrap_value, following["vf_preds"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo_name", ["IMPALA", "APPO"])
def test_recurrent_impala_and_appo_resume_bit_exactly_without_workers(algo_name, tmp_path):
    import lightning_rl

    algo = getattr(lightning_rl, algo_name)
    full, _, resumed = fit_in_halves(lambda: lstm_impala(algo, max_seq_len=4), tmp_path, batches=2)
    assert resumed.counters == full.counters
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


class CueRecall(gym.Env):
    """A cue (0 or 1) is shown at the first step only; at the last of ``length`` steps the action
    must repeat it (+1, else -1). Without memory the best return is 0 (chance)."""

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return np.array([2.0 * self.cue - 1.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        reward = (1.0 if int(action) == self.cue else -1.0) if done else 0.0
        return np.array([0.0, -self.t / self.length], dtype=np.float32), reward, done, False, {}


@pytest.mark.parametrize("use_lstm", [True, False])
def test_only_the_recurrent_policy_learns_to_recall_a_cue(use_lstm):
    """Seeded, 30k env steps: the LSTM recalls the cue (mean return of the last 100 episodes >
    0.8); the same PPO without it stays at chance (< 0.3)."""
    model = PPO(env=CueRecall, use_lstm=use_lstm, max_seq_len=8, lstm_cell_size=16, hiddens=(32,), num_envs=8,
                rollout_fragment_length=16, sgd_minibatch_size=64, num_sgd_iter=4, lr=3e-3, gamma=0.99,
                total_env_steps=30_000, seed=0, vectorization="sync", entropy_coeff=0.01)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(model)
    result = float(trainer.callback_metrics["rollout/episode_return_mean"])
    assert result > 0.8 if use_lstm else result < 0.3, result


def test_a_recurrent_policy_reading_previous_box_actions_evaluates():
    """Continuous actions as the previous-action input: a row per env through compute_actions."""
    from lightning_rl import evaluate

    model = PPO(env="Pendulum-v1", use_lstm=True, lstm_use_prev_action=True, lstm_use_prev_reward=True,
                max_seq_len=4, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, hiddens=(8,),
                lstm_cell_size=4, seed=0)
    actions, state = model.compute_actions(np.zeros((2, 3), np.float32), state=None, episode_start=np.ones(2, bool),
                                           prev_action=np.ones((2, 1), np.float32), prev_reward=np.zeros(2))
    assert actions.shape == (2, 1) and state.shape == (2, model.policies["default_policy"].state_size)
    returns = evaluate(model, num_episodes=2, seed=0)
    assert len(returns) == 2 and all(np.isfinite(returns))
