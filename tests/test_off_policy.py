"""DQN, SAC and the replay DataModule: flags, the priority loop, target networks, bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import DQN, SAC, ReplayDataModule, SampleBatch
from lightning_rl.data.settings import EnvSettings, ReplaySettings
from tests.conftest import fit_iterations, quiet_trainer
from tests.sb3_oracle import assert_same_weights, copy_weights, record_updates, train_on

SMALL = dict(env="CartPole-v1", seed=0, learning_starts=64, train_freq=32, num_gradient_steps=4,
             train_batch_size=32, buffer_size=1000, hiddens=(32,), total_env_steps=None, iterations_per_epoch=5)


def dqn(**kwargs) -> DQN:
    return DQN(**{**SMALL, **kwargs})


def sampled_batch(model, iterations: int = 4) -> tuple[SampleBatch, ReplayDataModule]:
    """A replay minibatch of 128 rows after ``iterations`` sampling iterations, and the DataModule."""
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    for _ in range(iterations):
        dm.sample()
    return dm.sample_minibatch("default_policy", 128, beta=0.4), dm


def test_double_q_changes_the_targets():
    batch, _ = sampled_batch(dqn())
    a, b = dqn(double_q=True), dqn(double_q=False)
    b.load_state_dict(a.state_dict())
    for model in (a, b):  # a target network that disagrees with the online one
        head = model.target_q["default_policy"].advantage_head
        torch.nn.init.normal_(head.weight, generator=torch.Generator().manual_seed(1))
    td_a = a.loss("default_policy", batch)[1]["td_error"]
    td_b = b.loss("default_policy", batch)[1]["td_error"]
    assert not torch.allclose(td_a, td_b)
    # without double Q the bootstrap is max_a Q_target(s', a): the larger target, so a smaller td error
    assert (td_b <= td_a + 1e-6).all()


def test_n_step_changes_sampled_targets():
    one, _ = sampled_batch(dqn(n_step=1))
    three, _ = sampled_batch(dqn(n_step=3))
    assert one["discounts"].unique().tolist() == [pytest.approx(0.99)]
    assert (three["discounts"] < 0.98).any() and three["rewards"].max() > 1.5


def test_priorities_after_a_step_equal_td_error_for_exactly_the_sampled_rows():
    model = dqn(prioritized_replay=True, prioritized_replay_alpha=0.7, prioritized_replay_eps=1e-3)
    batch, dm = sampled_batch(model)
    before = dm.buffer.priorities(np.arange(dm.buffer.capacity)).copy()
    _, results = model.loss("default_policy", batch)

    dm.update_priorities("default_policy", batch["batch_indexes"], results["td_error"])
    after = dm.buffer.priorities(np.arange(dm.buffer.capacity))
    idx = batch["batch_indexes"].numpy()
    expected = (np.abs(results["td_error"].numpy()) + 1e-3) ** 0.7
    last = {i: e for i, e in zip(idx, expected)}  # a repeated index keeps its last td error
    np.testing.assert_allclose(after[list(last)], list(last.values()), rtol=1e-5)
    untouched = np.setdiff1d(np.arange(dm.buffer.capacity), idx)
    np.testing.assert_array_equal(after[untouched], before[untouched])
    assert np.allclose(batch["weights"].numpy(), 1.0)  # new rows all had the max priority
    resampled = dm.sample_minibatch("default_policy", 128, beta=0.4)
    assert not np.allclose(resampled["weights"].numpy(), 1.0)  # now importance weights are in play


def test_uniform_replay_weights_are_one():
    batch, _ = sampled_batch(dqn())
    assert torch.equal(batch["weights"], torch.ones_like(batch["weights"]))


def test_priority_loop_runs_inside_fit_once_per_gradient_step():
    model = dqn(prioritized_replay=True)
    seen = []

    class Spy(ReplayDataModule):
        def update_priorities(self, policy_id, batch_indexes, td_error):
            seen.append(len(td_error))
            super().update_priorities(policy_id, batch_indexes, td_error)

    dm = Spy(EnvSettings("CartPole-v1", num_envs=1, seed=0, iterations_per_epoch=4),
             ReplaySettings(learning_starts=64, train_freq=32, buffer_size=1000, n_step=1, prioritized_replay=True),
             gamma=0.99)
    quiet_trainer(max_epochs=1).fit(model, datamodule=dm)
    assert model.counters["num_grad_updates"] == 4 * 3  # learning starts with the 2nd iteration
    assert seen == [32] * (4 * 3)  # the td errors of each gradient step's own rows, before the next sample


def test_learning_starts_uses_random_actions_and_no_updates():
    model = dqn(learning_starts=10_000)
    fit_iterations(model, 3)
    assert model.counters["num_grad_updates"] == 0 and model.counters["num_env_steps_sampled"] == 96


def test_num_gradient_steps_sets_updates_per_iteration():
    model = dqn(learning_starts=64, num_gradient_steps=7)
    fit_iterations(model, 4)
    assert model.counters["num_grad_updates"] == 7 * 3  # iteration 1 only fills the buffer


def test_hard_target_update_every_freq_global_env_steps():
    model = dqn(target_network_update_freq=64, learning_starts=32, num_gradient_steps=1)
    fit_iterations(model, 5)  # the checks see 0, 32, 64, 96, 128 env steps sampled before each iteration
    assert model.counters["num_target_updates"] == 2
    for t, o in zip(model.target_q.parameters(), model.policies.parameters()):
        assert torch.equal(t, o)  # the last update followed the last gradient step


def test_polyak_tau_moves_targets_part_way():
    model = dqn(tau=0.1, target_network_update_freq=0, learning_starts=32)
    before = [p.clone() for p in model.target_q.parameters()]
    fit_iterations(model, 3)
    assert model.counters["num_target_updates"] == model.counters["num_grad_updates"] == 3 * 4
    moved = [not torch.equal(b, t) for b, t in zip(before, model.target_q.parameters())]
    same = [torch.equal(t, o) for t, o in zip(model.target_q.parameters(), model.policies.parameters())]
    assert all(moved) and not any(same)


def test_epsilon_schedule():
    model = dqn(epsilon_start=1.0, epsilon_end=0.1, epsilon_timesteps=100)
    assert model.exploration_kwargs("default_policy")["epsilon"] == 1.0
    model.global_counters["num_env_steps_sampled"] = 50  # schedules read the global counters
    assert model.exploration_kwargs("default_policy")["epsilon"] == pytest.approx(0.55)
    model.global_counters["num_env_steps_sampled"] = 1000
    assert model.exploration_kwargs("default_policy")["epsilon"] == pytest.approx(0.1)
    greedy = model.policies["default_policy"].compute_actions(torch.zeros(200, 4), epsilon=0.0)["actions"]
    noisy = model.policies["default_policy"].compute_actions(torch.zeros(200, 4), epsilon=1.0)["actions"]
    assert greedy.unique().numel() == 1 and noisy.unique().numel() == 2


def test_dqn_lr_schedule():
    model = dqn(lr=1e-3, lr_schedule=[[0, 1e-3], [64, 1e-4]], learning_starts=32)
    fit_iterations(model, 3)
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(1e-4)


def sac(**kwargs) -> SAC:
    return SAC(**{"seed": 0, "learning_starts": 64, "train_batch_size": 32, "hiddens": (32,),
                  "total_env_steps": None, **kwargs})


def test_sac_updates_actor_critic_alpha_and_targets():
    model = sac()
    alpha0 = model.log_alpha["default_policy"].item()
    target0 = [p.clone() for p in model.target_critics.parameters()]
    fit_iterations(model, 80)
    assert model.counters["num_grad_updates"] == 80 - 63
    assert model.log_alpha["default_policy"].item() != alpha0
    assert all(not torch.equal(a, b) for a, b in zip(target0, model.target_critics.parameters()))


def test_sac_updates_match_stable_baselines3_on_the_same_minibatches(monkeypatch):
    """Oracle: Stable-Baselines3's ``SAC.train``, started from ours' initial weights and fed the
    minibatches and reparameterization noise ours' fit drew, ends at ours' actor, critics, target
    critics and temperature after 24 updates (the temperature read before its step in the
    critics' target and the actor's loss, on both sides)."""
    sb3 = pytest.importorskip("stable_baselines3")
    import gymnasium as gym

    model = sac(env="Pendulum-v1", learning_starts=32, train_batch_size=16, hiddens=(16,), buffer_size=2000,
                iterations_per_epoch=60)

    def as_theirs(actor_params):  # our head's [mean; log std] rows are SB3's two heads mu and log_std
        *trunk, weight, bias = actor_params
        return [*trunk, weight[:1], bias[:1], weight[1:], bias[1:]]

    actor0 = as_theirs([p.detach().clone() for p in model.policies.parameters()])
    critics0 = [p.detach().clone() for p in model.critics.parameters()]
    drawn = record_updates(monkeypatch, model, lambda g, rows: [torch.randn((rows, 1), generator=g),
                                                                torch.randn((rows, 1), generator=g)])
    fit_iterations(model, 55)  # 32 random env steps, then an update per env step
    assert len(drawn) == model.counters["num_grad_updates"] == 24

    theirs = sb3.SAC("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=model.lr, batch_size=16, tau=model.tau,
                     gamma=model.gamma, ent_coef="auto_1.0", target_entropy="auto",
                     policy_kwargs=dict(net_arch=list(model.hiddens)), seed=0, device="cpu")
    copy_weights(actor0, (theirs.actor,))
    copy_weights(critics0, (theirs.critic, theirs.critic_target))
    train_on(monkeypatch, theirs, drawn, action_half=2.0)
    assert_same_weights([(as_theirs(list(model.policies.parameters())), theirs.actor.parameters()),
                         (model.critics.parameters(), theirs.critic.parameters()),
                         (model.target_critics.parameters(), theirs.critic_target.parameters()),
                         (model.log_alpha.parameters(), [theirs.log_ent_coef])])
    assert not torch.equal(actor0[0], next(model.policies.parameters()))


def test_sac_actions_respect_any_bounds():
    import gymnasium as gym

    def wide():
        return gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), min_action=np.float32(-7.0),
                                          max_action=np.float32(11.0))

    model = sac(env=wide)
    actions = model.compute_actions(np.zeros((500, 3), dtype=np.float32))
    assert actions.min() >= -7.0 and actions.max() <= 11.0 and actions.max() - actions.min() > 5


def test_sac_target_entropy_auto_is_minus_the_action_dim():
    assert sac().target_entropy == -1.0  # Pendulum: one action dimension (the effect: tests/test_oracles.py)


def test_dqn_rejects_continuous_actions():
    with pytest.raises(ValueError, match=r"unsupported action space Box\(-2.0, 2.0, \(1,\), float32\).*Discrete"):
        DQN(env="Pendulum-v1")


def test_sac_rejects_discrete_actions():
    with pytest.raises(ValueError, match=r"unsupported action space Discrete\(2\).*Box"):
        SAC(env="CartPole-v1")


def test_buffer_smaller_than_train_batch():
    with pytest.raises(ValueError, match=r"buffer_size \(100\) is smaller than train_batch_size \(256\)"):
        DQN(buffer_size=100, train_batch_size=256)
    with pytest.raises(ValueError, match=r"buffer capacity \(4\) gives 4 rows per env .* n_step=3 needs at least 5"):
        ReplayDataModule(EnvSettings("CartPole-v1", num_envs=1), ReplaySettings(buffer_size=4, n_step=3), gamma=0.99)


class FirstLearningIteration(pl.Callback):
    """The DQN state before and after its first learning iteration (for the hand-written loops)."""

    def __init__(self) -> None:
        self.before: dict | None = None
        self.after: dict | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch.replay is not None and self.before is None:
            buffer = batch.replay.buffer
            self.before = copy.deepcopy(dict(
                q=module.policies.state_dict(), target=module.target_q.state_dict(),
                opt=module.optimizers().optimizer.state_dict(),
                buffer={k: v.copy() if isinstance(v, np.ndarray) else v for k, v in buffer.state_dict().items()},
                spaces=(buffer.observation_space, buffer.action_space)))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.before is not None and self.after is None:
            buffer = batch.replay.buffer
            priorities = buffer.priorities(np.arange(buffer.capacity)) if batch.replay.prioritized_replay else None
            self.after = copy.deepcopy(dict(
                q=module.policies.state_dict(), target=module.target_q.state_dict(), priorities=priorities))


def test_replay_loop_matches_a_hand_written_loop():
    """Per gradient step: sample (at the current beta) -> update -> priorities of exactly those rows ->
    Polyak target update, as the reference does; checked against the same steps written out by hand."""
    from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer
    from lightning_rl.functional import soft_update_

    kwargs = dict(prioritized_replay=True, num_gradient_steps=3, tau=0.5, target_network_update_freq=0,
                  learning_starts=64, grad_clip=0.5, prioritized_replay_beta=0.5)
    model = dqn(**kwargs)
    capture = FirstLearningIteration()
    fit_iterations(model, 3, callbacks=[capture])
    assert model.counters["num_grad_updates"] == 3 * 2  # learning started with the 2nd iteration

    # the same gradient steps by hand, from the captured state
    before = capture.before
    by_hand = dqn(**kwargs)
    by_hand.policies.load_state_dict(before["q"])
    by_hand.target_q.load_state_dict(before["target"])
    params = list(by_hand.policies.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3, fused=True)
    optimizer.load_state_dict(before["opt"])
    buffer = PrioritizedReplayBuffer(1000, *before["spaces"], num_envs=1, n_step=3, gamma=0.99, alpha=0.6, eps=1e-6)
    buffer.load_state_dict(before["buffer"])
    for _ in range(3):
        batch = buffer.sample(32, beta=0.5)  # no budget: beta stays at prioritized_replay_beta
        loss, results = by_hand.loss("default_policy", batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        buffer.update_priorities(batch["batch_indexes"], results["td_error"])  # before the next sample
        soft_update_(list(by_hand.target_q.parameters()), params, 0.5)  # tau after every gradient step

    after = capture.after
    torch.testing.assert_close(by_hand.policies.state_dict(), after["q"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(by_hand.target_q.state_dict(), after["target"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(buffer.priorities(np.arange(buffer.capacity)), after["priorities"], rtol=1e-5)


def test_uniform_replay_draws_an_iterations_minibatches_at_once():
    """Uniform replay: every minibatch of an iteration comes from one draw of
    ``num_gradient_steps * train_batch_size`` rows, in order (one gather instead of one per
    gradient step); checked against the same steps written out by hand."""
    from lightning_rl.data.buffers.replay_buffer import ReplayBuffer

    kwargs = dict(prioritized_replay=False, num_gradient_steps=3, target_network_update_freq=10_000,
                  learning_starts=64, grad_clip=0.5)
    model = dqn(**kwargs)
    capture = FirstLearningIteration()
    fit_iterations(model, 3, callbacks=[capture])
    assert model.counters["num_grad_updates"] == 3 * 2

    before = capture.before
    by_hand = dqn(**kwargs)
    by_hand.policies.load_state_dict(before["q"])
    by_hand.target_q.load_state_dict(before["target"])
    params = list(by_hand.policies.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3, fused=True)
    optimizer.load_state_dict(before["opt"])
    buffer = ReplayBuffer(1000, *before["spaces"], num_envs=1, n_step=3, gamma=0.99)
    buffer.load_state_dict(before["buffer"])  # its RNG too
    drawn = buffer.sample(3 * 32)  # the whole iteration's rows, one draw
    for i in range(3):
        loss, _ = by_hand.loss("default_policy", drawn.select(slice(32 * i, 32 * (i + 1))))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
    torch.testing.assert_close(by_hand.policies.state_dict(), capture.after["q"], rtol=1e-6, atol=1e-7)
