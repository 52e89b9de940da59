"""TD3 and DDPG (issue 38): the math by value (target policy smoothing clipped, clipped double Q,
the actor and the targets stepped on every ``policy_delay``-th critic update only), DDPG as TD3
with the three changes off, exploration noise, bit-exact resume (Ornstein-Uhlenbeck state
included), bad input refused in one line, and a seeded learning run on Pendulum-v1 (``slow``).
Compiled = eager, DDP and bf16 run in the shared parametrizations of tests/test_compile.py,
tests/test_ddp.py and tests/test_precision.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import DDPG, SAC, TD3, SampleBatch, evaluate
from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.functional import clipped_double_q_target, ornstein_uhlenbeck_step, smoothed_target_actions
from lightning_rl.nn.q_models import OrnsteinUhlenbeckNoise
from tests.conftest import fit_iterations, quiet_trainer
from tests.sb3_oracle import assert_same_weights, copy_weights, record_updates, train_on
from tests.test_non_finite import BadValueEnv
from tests.test_resume import straight_and_resumed, weights

PID = DEFAULT_POLICY_ID
SMALL = dict(env="Pendulum-v1", seed=0, hiddens=(16,), learning_starts=32, train_batch_size=16, buffer_size=2000,
             total_env_steps=None, iterations_per_epoch=40)


# --------------------------------------------------------------------------- pure functions
def test_target_policy_smoothing_clips_the_noise_then_the_action():
    next_actions = torch.tensor([[0.9, -0.2, 0.0], [-0.95, 0.1, 0.3]])
    noise = torch.tensor([[0.7, -0.1, -2.0], [-0.3, 0.6, 0.05]])
    expected = torch.tensor([[1.0, -0.3, -0.5], [-1.0, 0.6, 0.35]])  # noise to +-0.5, then the action to +-1
    torch.testing.assert_close(smoothed_target_actions(next_actions, noise, 0.5), expected)
    torch.testing.assert_close(smoothed_target_actions(next_actions, torch.zeros(2, 3), 0.5), next_actions)


def test_clipped_double_q_target_takes_the_smaller_critic_and_stops_at_terminations():
    rewards, discounts = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.9, 0.81, 0.9])
    terminated = torch.tensor([False, False, True])
    q1, q2 = torch.tensor([10.0, -3.0, 7.0]), torch.tensor([4.0, 5.0, 8.0])
    torch.testing.assert_close(clipped_double_q_target(rewards, discounts, terminated, (q1, q2)),
                               torch.tensor([1.0 + 0.9 * 4.0, 2.0 + 0.81 * -3.0, -1.0]))
    torch.testing.assert_close(clipped_double_q_target(rewards, discounts, terminated, (q1,)),  # DDPG: one critic
                               torch.tensor([1.0 + 0.9 * 10.0, 2.0 + 0.81 * -3.0, -1.0]))


def test_ornstein_uhlenbeck_step_and_process():
    x, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0])
    torch.testing.assert_close(ornstein_uhlenbeck_step(x, g, sigma=0.2, theta=0.15, dt=0.01),
                               torch.tensor([1.0 - 0.0015 + 0.2 * 0.1 * 0.5, -2.0 + 0.003]))
    noise, generator = OrnsteinUhlenbeckNoise(sigma=0.3), torch.Generator().manual_seed(0)
    draws = torch.stack([noise(torch.Size([4, 2]), generator, torch.device("cpu")) for _ in range(500)])
    steps = draws[1:] - draws[:-1] * (1 - 0.15 * 0.01)  # what is left of each step is the Gaussian part
    assert abs(steps.std().item() - 0.3 * 0.1) < 0.003
    last = noise.states[(4, 2)].clone()
    assert noise(torch.Size([1, 2]), generator, torch.device("cpu")).abs().max() < 0.2  # another batch: from zero
    assert torch.equal(noise.states[(4, 2)], last)  # ... and the first one's process left alone


def test_ornstein_uhlenbeck_process_starts_again_where_an_episode_ended():
    noise, generator = OrnsteinUhlenbeckNoise(sigma=0.3), torch.Generator().manual_seed(0)
    for _ in range(50):
        noise(torch.Size([3, 2]), generator, torch.device("cpu"))
    noise(torch.Size([1, 2]), generator, torch.device("cpu"))  # predict's process (another batch size)
    before, other = noise.states[(3, 2)].clone(), noise.states[(1, 2)].clone()
    noise.reset(np.array([False, True, False]))
    after = noise.states[(3, 2)]
    assert torch.equal(after[1], torch.zeros(2)) and before[1].abs().sum() > 0
    assert torch.equal(after[[0, 2]], before[[0, 2]]) and torch.equal(noise.states[(1, 2)], other)


class EndsEveryThreeSteps(gym.Wrapper):
    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, _, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, self.t % 3 == 0, info


def test_td3_sampling_resets_the_noise_of_the_envs_whose_episode_ended(monkeypatch):
    """The process each exploring action starts from: zero right after an env's episode ended
    (at the reset step of next-step autoreset), else where the last action left it."""
    entries = []
    draw = OrnsteinUhlenbeckNoise.__call__

    def watched(self, shape, generator, device):
        entries.append(self.states.get(tuple(shape), torch.full(tuple(shape), float("nan"))).clone())
        return draw(self, shape, generator, device)

    monkeypatch.setattr(OrnsteinUhlenbeckNoise, "__call__", watched)
    model = TD3(**{**SMALL, "env": lambda: EndsEveryThreeSteps(gym.make("Pendulum-v1")), "num_envs": 2,
                   "learning_starts": 0, "train_freq": 1, "action_noise": "ornstein-uhlenbeck"})
    fit_iterations(model, 12)
    assert len(entries) == 12  # one exploring action per iteration (train_freq 1), for both envs at once
    starts = torch.stack(entries[1:]).squeeze(-1)  # [call, env] for calls 2 to 12
    zero = [i for i in range(11) if (i + 2) % 4 == 0]  # calls 4, 8, 12: after steps 3, 7, 11 ended episodes
    assert (starts[zero] == 0).all() and (starts[[i for i in range(11) if i not in zero]] != 0).all()


# --------------------------------------------------------------------------- the update by value
def _transitions(model: TD3, n: int = 6) -> SampleBatch:
    g = torch.Generator().manual_seed(1)
    obs = torch.rand(n, 3, generator=g) * 2 - 1
    return SampleBatch({
        SampleBatch.OBS: obs, SampleBatch.ACTIONS: torch.rand(n, 1, generator=g) * 4 - 2,
        SampleBatch.REWARDS: torch.randn(n, generator=g), SampleBatch.NEXT_OBS: torch.rand(n, 3, generator=g) * 2 - 1,
        SampleBatch.TERMINATEDS: torch.tensor([False, True] * (n // 2)), SampleBatch.DISCOUNTS: torch.full((n,), 0.99),
        SampleBatch.WEIGHTS: torch.linspace(0.5, 1.5, n),
        "target_noise": torch.tensor([[2.0], [-2.0], [0.1], [-0.1], [0.7], [-0.7]])[:n],
    })


def test_critic_loss_is_the_clipped_double_q_error_at_smoothed_target_actions():
    model = TD3(**{**SMALL, "target_noise_clip": 0.3})
    batch = _transitions(model)
    loss, stats = model.critic_loss(PID, batch)
    with torch.no_grad():  # by hand: Pendulum's actions in [-2, 2] are halved into [-1, 1]
        clipped = batch["target_noise"].clamp(-0.3, 0.3)
        next_a = (model.target_actors[PID](batch[SampleBatch.NEXT_OBS]) + clipped).clamp(-1, 1)
        t1, t2 = model.target_critics[PID](batch[SampleBatch.NEXT_OBS], next_a)
        y = batch[SampleBatch.REWARDS] + 0.99 * (~batch[SampleBatch.TERMINATEDS]).float() * torch.minimum(t1, t2)
        q1, q2 = model.critics[PID](batch[SampleBatch.OBS], batch[SampleBatch.ACTIONS] / 2)
        expected = (batch[SampleBatch.WEIGHTS] * ((q1 - y) ** 2 + (q2 - y) ** 2)).mean()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(stats["td_error"], q1 - y)


def test_actor_loss_is_minus_the_first_critic_and_steps_only_the_actor():
    model = TD3(**SMALL)
    batch = _transitions(model)
    loss, _ = model.actor_loss(PID, batch)
    with torch.no_grad():
        obs = batch[SampleBatch.OBS]
        expected = -model.critics[PID](obs, model.policies[PID](obs))[0].mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None for p in model.critics.parameters())
    assert all(p.grad is not None for p in model.policies.parameters())


class Snapshots(pl.Callback):
    """The actor, critics and targets after every iteration, with the critic updates so far."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, torch.Tensor]]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        parts = {name: torch.cat([p.detach().flatten().clone() for p in getattr(module, name).parameters()])
                 for name in ("policies", "critics", "target_actors", "target_critics")}
        self.rows.append((module.counters["num_grad_updates"], parts))


@pytest.mark.parametrize("policy_delay", [1, 2, 3])
def test_the_actor_and_the_targets_step_on_every_policy_delay_th_critic_update_only(policy_delay):
    snapshots = Snapshots()
    model = TD3(**{**SMALL, "policy_delay": policy_delay, "iterations_per_epoch": 60})
    fit_iterations(model, 56, callbacks=[snapshots])  # one env step and one update per iteration from 32 on
    updates = 0
    for (before, old), (after, new) in zip(snapshots.rows, snapshots.rows[1:]):
        changed = {name: not torch.equal(old[name], new[name]) for name in old}
        if after == before:  # still filling the replay
            assert not any(changed.values())
            continue
        updates += 1
        assert changed["critics"], after
        delayed = after % policy_delay == 0
        assert changed["policies"] is changed["target_actors"] is changed["target_critics"] is delayed, after
    assert updates >= 20
    assert model.counters["num_target_updates"] == model.counters["num_grad_updates"] // policy_delay


def test_ddpg_is_td3_with_the_three_changes_off_and_each_change_matters():
    ddpg = DDPG(**SMALL)
    fit_iterations(ddpg, 48)
    assert not hasattr(ddpg.critics[PID], "q2") or ddpg.critics[PID].q2 is None  # one critic
    off = TD3(**SMALL, policy_delay=1, target_policy_noise=0.0, twin_q=False)
    fit_iterations(off, 48)
    torch.testing.assert_close(weights(off), weights(ddpg), rtol=0, atol=0)
    # smoothing noise clipped to 0 is no smoothing; each of the three changes changes the weights
    clipped_away = TD3(**SMALL, policy_delay=1, target_policy_noise=5.0, target_noise_clip=0.0, twin_q=False)
    fit_iterations(clipped_away, 48)
    torch.testing.assert_close(weights(clipped_away), weights(ddpg), rtol=0, atol=0)
    for change in (dict(policy_delay=2), dict(target_policy_noise=0.2), dict(twin_q=True)):
        other = DDPG(**SMALL, **change)
        fit_iterations(other, 48)
        actor = torch.cat([p.flatten() for p in other.policies.parameters()])
        assert not torch.equal(actor, torch.cat([p.flatten() for p in ddpg.policies.parameters()])), change


@pytest.mark.parametrize("action_noise", ["normal", "ornstein-uhlenbeck", None])
def test_exploration_noise_is_added_in_the_unit_scale_and_clipped_to_the_bounds(action_noise):
    model = TD3(**{**SMALL, "action_noise": action_noise, "action_noise_sigma": 0.5})
    actor = model.policies[PID]
    obs = torch.zeros(256, 3)
    greedy = actor.compute_actions(obs, explore=False)["actions"]
    generator = torch.Generator().manual_seed(0)
    explored = actor.compute_actions(obs, True, generator, **model.exploration_kwargs(PID))["actions"]
    assert explored.abs().max() <= 2.0  # Pendulum's bounds
    spread = (explored - greedy).std().item()
    if action_noise is None:
        assert spread == 0
    elif action_noise == "normal":
        assert 0.8 < spread < 1.2  # sigma 0.5 in [-1, 1] units is 1.0 in Pendulum's [-2, 2]
    else:
        assert 0 < spread < 0.2  # the process starts at zero: its first step is sigma * sqrt(dt) * N(0, 1)


# --------------------------------------------------------------------------- system
@pytest.mark.parametrize("action_noise", ["normal", "ornstein-uhlenbeck"])
def test_td3_resume_is_exact(tmp_path, action_noise):
    kwargs = {**SMALL, "action_noise": action_noise, "prioritized_replay": action_noise == "normal"}
    straight, resumed, _ = straight_and_resumed(TD3, kwargs, tmp_path, epochs=(1, 2))
    assert resumed.counters == straight.counters and straight.counters["num_grad_updates"] > 40
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
    if action_noise == "ornstein-uhlenbeck":
        assert list(resumed.noise.states) == [(1, 1)]  # Pendulum: one env, one action
        torch.testing.assert_close(resumed.noise.states[(1, 1)], straight.noise.states[(1, 1)], rtol=0, atol=0)
    checkpoint = torch.load(tmp_path / "half.ckpt", weights_only=True)
    assert checkpoint["lightning_rl"]["algorithm"] == "lightning_rl.algorithms.td3.TD3"
    assert checkpoint["lightning_rl"]["datamodule"]["ranks"][0]["buffer"] is not None  # the replay, as SAC's


def test_ddpg_checkpoint_loads_as_ddpg():
    model = DDPG(**SMALL)
    trainer = fit_iterations(model, 40)
    path = trainer.default_root_dir + "/ddpg.ckpt"
    trainer.save_checkpoint(path)
    restored = DDPG.load_from_checkpoint(path)
    assert type(restored) is DDPG and restored.twin_q is False
    torch.testing.assert_close(weights(restored), weights(model), rtol=0, atol=0)


@pytest.mark.parametrize("cls", [TD3, DDPG])
def test_non_box_actions_are_refused_in_one_line(cls):
    with pytest.raises(ValueError, match=rf"^unsupported action space Discrete\(2\): {cls.__name__} needs 1-D Box "
                                         r"actions$"):
        cls(env="CartPole-v1")


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("policy_delay", 0, "policy_delay must be >= 1"), ("target_policy_noise", -0.1, "must be >= 0"),
    ("action_noise", "uniform", "action_noise must be one of"),
])
def test_bad_settings_are_refused(setting, value, message):
    with pytest.raises(ValueError, match=message):
        TD3(**{**SMALL, setting: value})


class BadRewardPendulum(BadValueEnv):
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)


def test_a_nan_reward_is_named():
    model = TD3(**{**SMALL, "env": lambda: BadRewardPendulum("reward", at=20), "vectorization": "sync"})
    with pytest.raises(ValueError, match=r"env 0 of 1 .* returned a non-finite reward at its env step 20"):
        fit_iterations(model, 30)


# --------------------------------------------------------------------------- learning
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [0, 1])
def test_td3_pendulum_greedy_minus_250_within_10k_steps(seed):
    from tests.test_learning import train

    model = TD3(env="Pendulum-v1", seed=seed, hiddens=(64, 64), total_env_steps=10_000)
    curve = train(model)
    returns = evaluate(model, num_episodes=10, seed=123)
    assert np.mean(returns) >= -250, (returns, str(curve))


def test_td3_and_sac_share_the_replay_settings():
    """TD3 takes the same replay and target settings as SAC (one declaration, OffPolicyModule)."""
    import inspect

    shared = {"buffer_size", "learning_starts", "train_freq", "num_gradient_steps", "train_batch_size", "tau",
              "prioritized_replay", "checkpoint_replay_buffer", "compile"}
    for cls in (TD3, SAC):
        assert shared <= set(inspect.signature(cls.__init__).parameters)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=36)
    model = TD3(**SMALL)
    trainer.fit(model)
    assert trainer.global_step == model.counters["num_grad_updates"]  # an update is one (critic) optimizer step


def test_td3_updates_match_stable_baselines3_on_the_same_minibatches(monkeypatch):
    """Oracle: Stable-Baselines3's ``TD3.train``, started from ours' initial weights and fed the
    minibatches (and target smoothing noise) ours' fit drew, ends at ours' weights after 24 critic
    and 12 actor updates: actor, critics and both targets (Pendulum's [-2, 2] actions halved into
    SB3's [-1, 1] replay scale)."""
    sb3 = pytest.importorskip("stable_baselines3")
    model = TD3(**{**SMALL, "iterations_per_epoch": 60})
    actor0, critics0 = ([p.detach().clone() for p in m.parameters()] for m in (model.policies, model.critics))
    drawn = record_updates(monkeypatch, model, lambda g, rows: [model.target_policy_noise * torch.randn(
        (rows, 1), generator=g)])
    fit_iterations(model, 55)  # 32 random env steps, then an update per env step
    assert len(drawn) == model.counters["num_grad_updates"] == 24

    theirs = sb3.TD3("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=model.lr, batch_size=16, tau=model.tau,
                     gamma=model.gamma, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
                     policy_kwargs=dict(net_arch=list(SMALL["hiddens"])), seed=0, device="cpu")
    copy_weights(actor0, (theirs.actor, theirs.actor_target))
    copy_weights(critics0, (theirs.critic, theirs.critic_target))
    train_on(monkeypatch, theirs, drawn, action_half=2.0)
    assert_same_weights([(model.policies.parameters(), theirs.actor.parameters()),
                         (model.critics.parameters(), theirs.critic.parameters()),
                         (model.target_actors.parameters(), theirs.actor_target.parameters()),
                         (model.target_critics.parameters(), theirs.critic_target.parameters())])
    assert not torch.equal(actor0[0], next(model.policies.parameters()))
