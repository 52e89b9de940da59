"""Oracles by value for what other tests check only by shape or by "something changed":
the SAC tanh-squashed log-density, the dueling combination, importance weights in the
per-row loss, gradient clipping, and the hyperparameters that scale or steer an update
(``vf_loss_coeff``, ``initial_alpha``, ``target_entropy``, prioritized-replay beta)."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import distributions as td

from lightning_rl import A2C, DQN, PPO, SAC, SampleBatch
from lightning_rl.nn.models import preprocess_obs
from lightning_rl.nn.q_models import QNetwork, SquashedGaussianActor
from tests.conftest import fit_iterations

PID = "default_policy"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Recorder(pl.Callback):
    """Records, per Lightning training step, the non-empty ``learner_info`` it returned, and
    for every optimizer step the gradients (and their total norm) that were stepped."""

    def __init__(self) -> None:
        self.infos: list[dict] = []
        self.steps: list[dict] = []  # {"optimizer": index, "grads": [Tensor | None], "norm": float}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            optimizer.register_step_pre_hook(self._hook(index))

    def _hook(self, index: int):
        def record(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
            present = [g for g in grads if g is not None]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in present])).item()
            self.steps.append({"optimizer": index, "grads": grads, "norm": norm})

        return record

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs and outputs.get("learner_info"):
            self.infos.append(outputs["learner_info"][PID])


def record_fit(model: pl.LightningModule, iterations: int) -> Recorder:
    recorder = Recorder()
    fit_iterations(model, iterations, callbacks=[recorder])
    return recorder


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


# --------------------------------------------------------------------------- SAC: squashed Gaussian

BOX_OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)


def seeded_actor(action_space: gym.Space, hiddens: tuple[int, ...] = (16,)) -> SquashedGaussianActor:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return SquashedGaussianActor(BOX_OBS, action_space, hiddens=hiddens)


def actor_with_fixed_head(mean: list[float], log_std: list[float],
                          action_space: gym.Space | None = None) -> SquashedGaussianActor:
    """An actor whose mean and log std are the given constants for every observation."""
    actor = seeded_actor(action_space or gym.spaces.Box(-1.0, 1.0, (len(mean),), np.float32), hiddens=(8,))
    with torch.no_grad():
        actor.head.weight.zero_()
        actor.head.bias.copy_(torch.tensor(mean + log_std))
    return actor


def heads(actor: SquashedGaussianActor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's own mean and (clamped) log std, as its forward reads them."""
    mean, log_std = actor.head(actor.encoder(preprocess_obs(obs, actor.observation_space))).chunk(2, dim=-1)
    return mean, log_std.clamp(actor.LOG_STD_MIN, actor.LOG_STD_MAX)


def reference_sample(actor: SquashedGaussianActor, obs: torch.Tensor, seed: int | None):
    """Action and log-density from ``torch.distributions``: an independent Normal pushed through
    ``TanhTransform``, evaluated in float64 at the sample drawn with the actor's noise.

    The transform caches ``(x, tanh x)``, so ``log_prob`` inverts the action exactly even where
    ``tanh x`` rounds to +-1."""
    mean, log_std = heads(actor, obs)
    if seed is None:
        pre_tanh = mean
    else:
        noise = torch.randn(mean.shape, generator=gen(seed))
        pre_tanh = mean + noise * log_std.exp()
    mean, std, pre_tanh = mean.double(), log_std.double().exp(), pre_tanh.double()
    tanh = td.TanhTransform(cache_size=1)
    action = tanh(pre_tanh)
    dist = td.Independent(td.TransformedDistribution(td.Normal(mean, std), [tanh]), 1)
    return action, dist.log_prob(action), pre_tanh


@pytest.mark.parametrize("deterministic", [False, True])
def test_squashed_gaussian_log_prob_matches_torch_tanh_transform(deterministic):
    actor = seeded_actor(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    obs = torch.randn(64, 3, generator=gen(0)) * 3
    actions, logp = actor(obs, deterministic=deterministic, generator=None if deterministic else gen(7))
    ref_actions, ref_logp, _ = reference_sample(actor, obs, None if deterministic else 7)
    assert logp.shape == (64,)
    torch.testing.assert_close(actions.double(), ref_actions, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logp.double(), ref_logp, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("mean", "log_std"),
    [
        ([12.0, -12.0], [-1.0, -1.0]),  # tanh rounds to exactly +-1 in float32
        ([9.0, -8.5], [-5.0, -3.0]),  # narrow and far out: 1 - tanh^2 ~ 1e-7, most of it lost in float32
        ([6.0, -14.0], [0.5, -2.0]),
        ([0.3, -0.2], [5.0, -30.0]),  # log std outside [-20, 2]: clamped
    ],
)
def test_squashed_gaussian_log_prob_near_the_bounds(mean, log_std):
    actor = actor_with_fixed_head(mean, log_std)
    obs = torch.zeros(256, 3)
    actions, logp = actor(obs, generator=gen(3))
    ref_actions, ref_logp, pre_tanh = reference_sample(actor, obs, 3)
    assert torch.isfinite(logp).all()
    torch.testing.assert_close(actions.double(), ref_actions, rtol=0, atol=1e-6)
    torch.testing.assert_close(logp.double(), ref_logp, rtol=1e-5, atol=2e-4)
    if abs(mean[0]) >= 12:  # the case is really the hard one: the naive float32 formula fails there
        naive = torch.log(1 - torch.tanh(pre_tanh.float()) ** 2)
        assert torch.isinf(naive).any()


def test_squashed_gaussian_jacobian_against_high_precision():
    """The tanh log-Jacobian at large pre-tanh values, against 50-digit arithmetic rather than
    torch's own (identical) stable formula."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    mean = [3.0, 7.0, 11.0, 15.0]
    log_std = -20.0
    actor = actor_with_fixed_head(mean, [log_std] * 4)
    _, logp = actor(torch.zeros(1, 3), deterministic=True)
    gaussian = len(mean) * (-log_std - 0.5 * math.log(2 * math.pi))  # the Normal's log-density at its mean
    exact = gaussian - sum(float(mpmath.log(1 - mpmath.tanh(m) ** 2)) for m in mean)
    # float32 logp of size ~110: a few ulps
    assert logp.item() == pytest.approx(exact, rel=2e-6)


def test_squashed_gaussian_gradient_matches_torch_rsample():
    actor = seeded_actor(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    obs = torch.randn(32, 3, generator=gen(1))
    actions, logp = actor(obs, generator=gen(5))
    (logp.sum() + actions.pow(2).sum()).backward()
    ours = [p.grad.clone() for p in actor.parameters()]
    actor.zero_grad()
    mean, log_std = heads(actor, obs)
    noise = torch.randn(mean.shape, generator=gen(5))
    tanh = td.TanhTransform(cache_size=1)
    pre_tanh = mean + noise * log_std.exp()  # the reparameterized sample, as rsample draws it
    ref_actions = tanh(pre_tanh)
    dist = td.Independent(td.TransformedDistribution(td.Normal(mean, log_std.exp()), [tanh]), 1)
    (dist.log_prob(ref_actions).sum() + ref_actions.pow(2).sum()).backward()
    for a, b in zip(ours, (p.grad for p in actor.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_squashed_gaussian_env_scaling_with_asymmetric_bounds():
    low, high = np.array([-7.0, 0.0, 0.5], np.float32), np.array([11.0, 3.0, 4.0], np.float32)
    space = gym.spaces.Box(low, high, dtype=np.float32)
    actor = seeded_actor(space)
    obs = torch.randn(50, 3, generator=gen(2))
    low_t, high_t = torch.from_numpy(low), torch.from_numpy(high)

    greedy = actor.compute_actions(obs, explore=False)["actions"]
    mean, _ = heads(actor, obs)
    torch.testing.assert_close(greedy, low_t + (torch.tanh(mean) + 1) / 2 * (high_t - low_t))

    explored = actor.compute_actions(obs, explore=True, generator=gen(9))["actions"]
    squashed, _ = actor(obs, generator=gen(9))
    torch.testing.assert_close(explored, low_t + (squashed + 1) / 2 * (high_t - low_t))
    torch.testing.assert_close(actor.normalize(explored), squashed, rtol=1e-5, atol=1e-5)

    # saturated means land on the bounds themselves
    saturated = actor_with_fixed_head([20.0, -20.0, 20.0], [-20.0] * 3, space)
    torch.testing.assert_close(saturated.compute_actions(obs[:2], explore=False)["actions"],
                               torch.tensor([[11.0, 0.0, 4.0]] * 2))


def test_sac_compute_actions_map_to_asymmetric_env_bounds():
    def skewed():
        return gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), min_action=np.float32(-7.0),
                                          max_action=np.float32(11.0))

    model = SAC(env=skewed, seed=0, hiddens=(16,), total_env_steps=None)
    obs = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    mean, _ = heads(model.policies[PID], torch.from_numpy(obs))
    expected = -7.0 + (torch.tanh(mean) + 1) / 2 * 18.0
    np.testing.assert_allclose(model.compute_actions(obs, explore=False), expected.detach().numpy(), rtol=1e-5)


# --------------------------------------------------------------------------- dueling Q


def test_dueling_q_is_value_plus_centred_advantage():
    space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    torch.manual_seed(0)
    net = QNetwork(space, gym.spaces.Discrete(5), hiddens=(16,), dueling=True)
    obs = torch.randn(20, 4, generator=gen(0))
    features = net.encoder(preprocess_obs(obs, space))
    value, advantages = net.value_head(features), net.advantage_head(features)
    q = net(obs)
    torch.testing.assert_close(q, value + advantages - advantages.mean(-1, keepdim=True))
    # identifiable: the mean over actions is V, and Q differences are A differences
    torch.testing.assert_close(q.mean(-1), value.squeeze(-1))
    torch.testing.assert_close(q - q[:, :1], advantages - advantages[:, :1])
    # a shift of every advantage leaves Q unchanged
    with torch.no_grad():
        net.advantage_head.bias += 3.0
    torch.testing.assert_close(net(obs), q, rtol=1e-5, atol=1e-5)


def test_plain_q_is_the_advantage_head():
    space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    torch.manual_seed(0)
    net = QNetwork(space, gym.spaces.Discrete(3), hiddens=(16,), dueling=False)
    obs = torch.randn(10, 4, generator=gen(1))
    torch.testing.assert_close(net(obs), net.advantage_head(net.encoder(obs)))


# --------------------------------------------------------------------------- importance weights in the loss

SMALL_DQN = dict(env="CartPole-v1", seed=0, hiddens=(32,), total_env_steps=None, vectorization="sync")


def hand_batch(n: int = 16, seed: int = 0) -> SampleBatch:
    g = gen(seed)
    return SampleBatch(
        obs=torch.randn(n, 4, generator=g),
        actions=torch.randint(2, (n,), generator=g),
        rewards=torch.randn(n, generator=g) * 3,  # td errors on both sides of the Huber threshold
        next_obs=torch.randn(n, 4, generator=g),
        terminateds=torch.rand(n, generator=g) < 0.3,
        discounts=torch.full((n,), 0.99**3),
        weights=torch.rand(n, generator=g) + 0.1,
        batch_indexes=torch.arange(n),
    )


def dqn_reference_td(model: DQN, batch: SampleBatch) -> torch.Tensor:
    """Double-Q n-step TD errors, written out independently of ``DQN.loss``."""
    online, target = model.policies[PID], model.target_q[PID]
    rows = torch.arange(batch.count)
    with torch.no_grad():
        q = online(batch["obs"])[rows, batch["actions"]]
        best = online(batch["next_obs"]).argmax(-1)
        bootstrap = target(batch["next_obs"])[rows, best]
        y = batch["rewards"] + batch["discounts"] * (~batch["terminateds"]).float() * bootstrap
    return q - y


def huber(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.abs() <= 1.0, 0.5 * x**2, x.abs() - 0.5)


def test_dqn_loss_is_the_weighted_mean_of_huber_td():
    model = DQN(**SMALL_DQN)
    with torch.no_grad():  # a target network that disagrees with the online one
        for p in model.target_q.parameters():
            p.add_(torch.randn(p.shape, generator=gen(4)) * 0.5)
    batch = hand_batch()
    td_ref = dqn_reference_td(model, batch)
    assert (td_ref.abs() > 1).any() and (td_ref.abs() < 1).any()  # both Huber branches in play
    loss, results = model.loss(PID, batch)
    torch.testing.assert_close(results["td_error"], td_ref)
    torch.testing.assert_close(loss, (batch["weights"] * huber(td_ref)).mean())
    doubled = SampleBatch({**batch, "weights": 2 * batch["weights"]})
    torch.testing.assert_close(model.loss(PID, doubled)[0], 2 * loss)


def test_dqn_zero_weight_removes_exactly_that_row():
    model = DQN(**SMALL_DQN)
    batch, i, n = hand_batch(), 5, 16
    w = batch["weights"].clone()
    w[i] = 0.0
    zeroed = SampleBatch({**batch, "weights": w, "obs": batch["obs"].clone().requires_grad_(True)})
    loss, results = model.loss(PID, zeroed)
    full_loss, _ = model.loss(PID, batch)
    td_ref = dqn_reference_td(model, batch)
    torch.testing.assert_close(loss, full_loss - batch["weights"][i] * huber(td_ref[i]) / n)
    loss.backward()
    obs_grad = zeroed["obs"].grad
    assert torch.equal(obs_grad[i], torch.zeros(4)) and obs_grad[torch.arange(n) != i].abs().sum() > 0
    # the row's td error is still reported: its priority must still be updated
    torch.testing.assert_close(results["td_error"][i], td_ref[i])
    # parameter gradients: the same as the mean over the other rows, rescaled from n - 1 to n rows
    model.zero_grad()
    grads_zeroed = torch.autograd.grad(model.loss(PID, SampleBatch({**batch, "weights": w}))[0],
                                       list(model.policies.parameters()))
    others = batch.select(torch.arange(n) != i)
    grads_without = torch.autograd.grad(model.loss(PID, others)[0], list(model.policies.parameters()))
    for a, b in zip(grads_zeroed, grads_without):
        torch.testing.assert_close(a, b * (n - 1) / n)


def sac_one_update(batch: SampleBatch, seed: int = 0) -> tuple[dict, list[torch.Tensor], SAC]:
    """One ``SAC.update`` outside a Trainer (plain optimizers and backward); returns its results,
    the critic gradients it stepped, and the model as it was before the update."""
    model = SAC(env="Pendulum-v1", seed=0, hiddens=(16,), total_env_steps=None)
    before = copy.deepcopy(model)
    optimizers = model.configure_optimizers()
    critic_grads: list[torch.Tensor] = []
    optimizers[1].register_step_pre_hook(
        lambda opt, args, kwargs: critic_grads.extend(p.grad.clone() for p in model.critics.parameters()))
    model.optimizers = lambda: optimizers
    model.manual_backward = lambda loss: loss.backward()
    torch.manual_seed(seed)  # the actor's own samples inside the update
    results = model.update(PID, batch)
    return results, critic_grads, before


def sac_batch(n: int = 12) -> SampleBatch:
    g = gen(11)
    return SampleBatch(
        obs=torch.randn(n, 3, generator=g), actions=torch.rand(n, 1, generator=g) * 4 - 2,
        rewards=torch.randn(n, generator=g), next_obs=torch.randn(n, 3, generator=g),
        terminateds=torch.zeros(n, dtype=torch.bool), discounts=torch.full((n,), 0.99),
        weights=torch.rand(n, generator=g) + 0.5, batch_indexes=torch.arange(n),
    )


def test_sac_critic_loss_is_weighted_by_row():
    batch = sac_batch()
    results, _, before = sac_one_update(batch)
    q1, q2 = before.critics[PID](batch["obs"], batch["actions"] / 2.0)  # Pendulum: actions in [-2, 2]
    td1 = results["td_error"]  # q1 - target
    td2 = q2.detach() - (q1.detach() - td1)
    expected = 0.5 * (batch["weights"] * (td1**2 + td2**2)).mean()
    torch.testing.assert_close(results["learner_stats"]["critic_loss"], expected)


def test_sac_zero_weight_row_does_not_reach_the_critic_gradient():
    batch, i = sac_batch(), 4
    w = batch["weights"].clone()
    w[i] = 0.0
    moved = batch["rewards"].clone()
    moved[i] += 100.0
    _, g_zero, _ = sac_one_update(SampleBatch({**batch, "weights": w}))
    _, g_zero_moved, _ = sac_one_update(SampleBatch({**batch, "weights": w, "rewards": moved}))
    _, g_full, _ = sac_one_update(batch)
    _, g_full_moved, _ = sac_one_update(SampleBatch({**batch, "rewards": moved}))
    for a, b in zip(g_zero, g_zero_moved):
        torch.testing.assert_close(a, b)
    assert any(not torch.allclose(a, b) for a, b in zip(g_full, g_full_moved))


# --------------------------------------------------------------------------- grad_clip

PPO_BASE = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, num_sgd_iter=1, sgd_minibatch_size=64,
                seed=3, vectorization="sync", total_env_steps=None)


@pytest.mark.parametrize("make", [
    lambda clip: PPO(**PPO_BASE, grad_clip=clip),
    lambda clip: DQN(**SMALL_DQN, learning_starts=64, train_freq=64, num_gradient_steps=2, train_batch_size=32,
                     grad_clip=clip),
], ids=["ppo", "dqn"])
def test_grad_clip_bounds_the_stepped_gradient_norm(make):
    limit = 1e-3
    clipped = record_fit(make(limit), 2).steps
    free = record_fit(make(None), 2).steps
    assert len(clipped) == len(free) >= 2
    # every raw gradient is far above the limit, so clipping scales each to the limit itself
    assert all(s["norm"] > 10 * limit for s in free)
    for s in clipped:
        assert s["norm"] == pytest.approx(limit, rel=1e-4)
    # clipping rescales, it does not turn: the first step's gradient is the raw one times a scalar
    raw = torch.cat([g.flatten() for g in free[0]["grads"]])
    torch.testing.assert_close(torch.cat([g.flatten() for g in clipped[0]["grads"]]), raw * (limit / raw.norm()),
                               rtol=1e-4, atol=1e-9)


# --------------------------------------------------------------------------- vf_loss_coeff


def value_param_mask(model) -> list[bool]:
    policy = model.policies[PID]
    value_ids = {id(p) for m in (policy.vf_encoder, policy.vf_head) if m is not None for p in m.parameters()}
    return [id(p) in value_ids for p in policy.parameters()]


ON_POLICY = {
    "ppo": lambda **kw: PPO(**{**PPO_BASE, "grad_clip": None, **kw}),
    "a2c": lambda **kw: A2C(env="CartPole-v1", num_envs=4, rollout_fragment_length=8, seed=3, vectorization="sync",
                            total_env_steps=None, grad_clip=None, **kw),
}


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_vf_loss_coeff_scales_the_value_gradient(algo):
    make = ON_POLICY[algo]
    half = record_fit(make(vf_loss_coeff=0.5), 1).steps[0]["grads"]
    double = record_fit(make(vf_loss_coeff=2.0), 1).steps[0]["grads"]
    for is_value, a, b in zip(value_param_mask(make()), half, double):
        if is_value:
            torch.testing.assert_close(b, 4 * a, rtol=1e-5, atol=1e-8)
            assert a.abs().sum() > 0
        else:
            torch.testing.assert_close(b, a)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_vf_loss_coeff_zero_leaves_the_critic_alone(algo):
    model = ON_POLICY[algo](vf_loss_coeff=0.0)
    before = [p.detach().clone() for p in model.policies[PID].parameters()]
    fit_iterations(model, 2)
    for is_value, b, p in zip(value_param_mask(model), before, model.policies[PID].parameters()):
        assert torch.equal(b, p) == is_value


def test_vf_loss_coeff_is_linear_in_shared_layers():
    steps = {c: record_fit(PPO(**{**PPO_BASE, "grad_clip": None, "vf_share_layers": True, "vf_loss_coeff": c}),
                           1).steps[0]["grads"] for c in (0.0, 0.5, 2.0)}
    # d(pg + c * vf) = d pg + c * d vf: the shared encoder sees both terms
    for g0, g_half, g2 in zip(steps[0.0], steps[0.5], steps[2.0]):
        torch.testing.assert_close(g2 - g0, 4 * (g_half - g0), rtol=1e-4, atol=1e-7)
    assert not torch.equal(steps[0.0][0], steps[2.0][0])  # the first shared layer's weight sees the value loss


# --------------------------------------------------------------------------- SAC temperature

SAC_ONE_STEP = dict(env="Pendulum-v1", seed=0, hiddens=(16,), total_env_steps=None, vectorization="sync",
                    learning_starts=64, train_freq=64, num_gradient_steps=1, train_batch_size=32)


@pytest.mark.parametrize(("initial_alpha", "target_entropy"), [(0.5, 5.0), (0.5, -5.0), (2.0, "auto")])
def test_first_alpha_step_follows_logp_plus_target_entropy(initial_alpha, target_entropy):
    """``alpha_loss = -log_alpha * (logp + target_entropy)``: Adam's first step moves
    ``log_alpha`` by exactly ``lr`` in the sign of ``mean(logp) + target_entropy``."""
    lr = 1e-3
    model = SAC(**SAC_ONE_STEP, lr=lr, initial_alpha=initial_alpha, target_entropy=target_entropy)
    assert model.log_alpha[PID].exp().item() == pytest.approx(initial_alpha, rel=1e-6)
    info = record_fit(model, 1).infos
    assert len(info) == 1 and model.counters["num_grad_updates"] == 1
    stats = info[0]["learner_stats"]
    te = -1.0 if target_entropy == "auto" else target_entropy
    direction = math.copysign(1.0, te - float(stats["entropy"]))  # entropy = -mean(logp)
    expected = initial_alpha * math.exp(lr * direction)
    # "alpha" is the temperature the update's critic target and actor loss used: from before its step
    assert float(stats["alpha"]) == pytest.approx(initial_alpha, rel=1e-6)
    assert model.log_alpha[PID].exp().item() == pytest.approx(expected, rel=1e-5)
    if target_entropy == 5.0:  # above any entropy on [-1, 1] (at most log 2): alpha must rise
        assert direction > 0
    if target_entropy == -5.0:  # far below a fresh policy's entropy: alpha must fall
        assert direction < 0


@pytest.mark.parametrize(("flag", "a", "b"), [("initial_alpha", 1.0, 0.05), ("target_entropy", 5.0, -5.0)])
def test_temperature_flags_change_actor_and_critic(flag, a, b):
    kw = {**SAC_ONE_STEP, "num_gradient_steps": 3}
    first, again, second = SAC(**kw, **{flag: a}), SAC(**kw, **{flag: a}), SAC(**kw, **{flag: b})
    for model in (first, again, second):
        fit_iterations(model, 1)
    # seeded runs repeat bit for bit (the update's noise comes from the seeded learner generator), so
    # any difference is the flag's doing
    for name in ("policies", "critics"):
        assert torch.equal(flat_params(getattr(first, name)), flat_params(getattr(again, name))), name
        assert not torch.equal(flat_params(getattr(first, name)), flat_params(getattr(second, name))), name


# --------------------------------------------------------------------------- prioritized replay beta


class WeightSpy(DQN):
    """DQN recording the importance weights that reach its loss."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen_weights: list[torch.Tensor] = []

    def loss(self, policy_id, batch):
        self.seen_weights.append(batch["weights"].clone())
        return super().loss(policy_id, batch)


PER = dict(SMALL_DQN, prioritized_replay=True, learning_starts=64, train_freq=64, num_gradient_steps=1,
           train_batch_size=32, n_step=1)


def weights_of_second_update(**kw) -> torch.Tensor:
    """The first update samples rows that all still have the max priority (weights 1); the second
    samples after one priority update, with the same rows in every run that shares the seed."""
    model = WeightSpy(**{**PER, **kw})
    fit_iterations(model, 2)
    first, second = model.seen_weights
    assert torch.equal(first, torch.ones_like(first))
    return second


def log_weight_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``log a / log b`` on rows where ``b`` is not 1: ``w = (P / P_min) ** -beta``, so this is a beta ratio."""
    informative = b.log().abs() > 1e-3
    assert informative.sum() >= 5
    return a[informative].log() / b[informative].log()


def test_beta_is_the_exponent_of_the_weights_reaching_the_loss():
    unbounded = 10**9  # annealing over 1e9 steps: beta stays at its start within 1e-7
    w_low = weights_of_second_update(prioritized_replay_beta=0.3, total_env_steps=unbounded)
    w_high = weights_of_second_update(prioritized_replay_beta=0.6, total_env_steps=unbounded)
    ratio = log_weight_ratio(w_high, w_low)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 2.0), rtol=1e-4, atol=0)
    w_zero = weights_of_second_update(prioritized_replay_beta=0.0, total_env_steps=unbounded)
    torch.testing.assert_close(w_zero, torch.ones_like(w_zero), rtol=0, atol=1e-5)


def test_beta_anneals_toward_one_over_total_env_steps():
    total, beta0 = 256, 0.5
    annealed = weights_of_second_update(prioritized_replay_beta=beta0, total_env_steps=total)
    constant = weights_of_second_update(prioritized_replay_beta=beta0, total_env_steps=10**9)
    # beta follows the global env steps sampled before the iteration (every schedule does): the
    # second update is in the 2nd iteration, after train_freq = 64 env steps: beta = 0.5 + 0.5 * 64 / 256
    ratio = log_weight_ratio(annealed, constant)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 0.625 / beta0), rtol=1e-4, atol=0)


def test_beta_changes_the_update():
    kw = {**PER, "total_env_steps": 10**9}
    first = WeightSpy(**kw, prioritized_replay_beta=0.0)
    second = WeightSpy(**kw, prioritized_replay_beta=1.0)
    fit_iterations(first, 2)
    fit_iterations(second, 2)
    assert not torch.equal(flat_params(first.policies), flat_params(second.policies))


def test_beta_is_kept_without_an_env_step_budget():
    w_low = weights_of_second_update(prioritized_replay_beta=0.3, total_env_steps=None)
    w_high = weights_of_second_update(prioritized_replay_beta=0.6, total_env_steps=None)
    ratio = log_weight_ratio(w_high, w_low)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 2.0), rtol=1e-4, atol=0)
