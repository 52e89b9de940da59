"""Soft Actor-Critic (Haarnoja et al. 2018, https://arxiv.org/abs/1812.05905) with automatic
entropy tuning and twin Q-networks."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from lightning_rl.algorithms.off_policy import ContinuousOffPolicyModule
from lightning_rl.batch import DEFAULT_POLICY_ID, SampleBatch
from lightning_rl.functional import soft_update_
from lightning_rl.nn.q_models import SquashedGaussianActor, TwinQ
from lightning_rl.settings import positive, setting, settings
from lightning_rl.update import call, policy_loss


@settings
class SAC(ContinuousOffPolicyModule):
    """SAC for Box actions of any bounds; defaults are rl-zoo's Pendulum-v1 settings.

    Per replay minibatch, in this order (as in the paper's reference code), with ``alpha`` the
    temperature before this minibatch's temperature step (as the reference and
    Stable-Baselines3 read it)::

        alpha_loss  = -mean(log_alpha * (log pi(a~|s) + target_entropy))
        target      = R + gamma^k (1 - terminated) (min_i Q_target_i(s', a') - alpha log pi(a'|s'))
        critic_loss = 0.5 * mean(weights * sum_i (Q_i(s, a) - target)^2)
        actor_loss  = mean(alpha * log pi(a~|s) - min_i Q_i(s, a~))

    then target critics move toward the critics by Polyak averaging with ``tau``. Each
    optimizer steps (and, under DDP, averages over ranks) only its own parameters' gradients.
    An update is one of Lightning's optimizer steps (``trainer.global_step``, which ``max_steps``
    counts): the actor's; the temperature's and the critics' are not counted (nor seen by
    ``on_before_optimizer_step`` hooks).
    Image observations (``encoder`` unset): the actor and each critic read them through a CNN
    of their own (``nn/cnn.py``), the replay keeps them in their dtype.
    """

    lr: float = 1e-3
    """Adam's learning rate of the actor, the critics and the temperature."""
    tau: float = 0.005
    """Polyak coefficient of the target critics, per update."""
    initial_alpha: float = setting(default=1.0, check=positive)
    """entropy temperature at the start (learned toward ``target_entropy``)."""
    target_entropy: float | str = "auto"
    """``auto`` (``-action_dim``) or a number: the policy entropy the temperature aims at."""

    def __post_init__(self) -> None:
        super().__post_init__()
        with torch.random.fork_rng():
            if self.seed is not None:
                torch.manual_seed(self.seed)
            self.policies[DEFAULT_POLICY_ID] = SquashedGaussianActor(
                self.observation_space, self.action_space, self.hiddens, self.activation, self.encoder
            )
            action_dim = int(self.action_space.shape[0])
            self.critics = nn.ModuleDict({DEFAULT_POLICY_ID: TwinQ(self.observation_space, action_dim, self.hiddens,
                                                                   self.activation, self.encoder)})
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.ParameterDict(
            {DEFAULT_POLICY_ID: nn.Parameter(torch.tensor(float(self.initial_alpha)).log())}
        )
        self.target_entropy = -float(action_dim) if self.target_entropy == "auto" else float(self.target_entropy)

    def configure_optimizers(self) -> Any:
        pid = DEFAULT_POLICY_ID
        return [
            torch.optim.Adam(self.policies[pid].parameters(), lr=self.lr, fused=True),
            torch.optim.Adam(self.critics[pid].parameters(), lr=self.lr, fused=True),
            torch.optim.Adam([self.log_alpha[pid]], lr=self.lr),
        ]

    def alpha_loss(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None) -> Any:
        """Temperature loss ``-log_alpha * (log pi(a|s) + target_entropy)`` (Haarnoja et al. 2018b, eq. 18)."""
        log_alpha = self.log_alpha[policy_id] if params is None else params["log_alpha"]
        with torch.no_grad():
            _, logp = self.policies[policy_id](batch[SampleBatch.OBS], noise=batch["noise"])
        alpha_loss = -(log_alpha * (logp + self.target_entropy)).mean()
        return alpha_loss, {"alpha_loss": alpha_loss.detach(), "entropy": -logp.mean()}

    def critic_loss(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None) -> Any:
        """Clipped double-Q soft Bellman error, weighted by the replay's importance weights."""
        actor, critic = self.policies[policy_id], self.critics[policy_id]
        with torch.no_grad():
            alpha = batch["alpha"]
            next_obs = batch[SampleBatch.NEXT_OBS]
            next_actions, next_logp = actor(next_obs, noise=batch["next_noise"])
            next_q = torch.minimum(*self.target_critics[policy_id](next_obs, next_actions)) - alpha * next_logp
            not_done = 1.0 - batch[SampleBatch.TERMINATEDS].float()
            target = batch[SampleBatch.REWARDS] + batch[SampleBatch.DISCOUNTS] * not_done * next_q
        q1, q2 = call(critic, params, batch[SampleBatch.OBS], actor.normalize(batch[SampleBatch.ACTIONS]))
        critic_loss = 0.5 * (batch[SampleBatch.WEIGHTS] * ((q1 - target).pow(2) + (q2 - target).pow(2))).mean()
        return critic_loss, {"critic_loss": critic_loss.detach(), "alpha": alpha, "mean_q": q1.detach().mean(),
                             "td_error": (q1 - target).detach()}

    def actor_loss(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None) -> Any:
        """``alpha * log pi(a|s) - min Q(s, a)`` with reparameterized ``a`` (the critic just stepped)."""
        obs = batch[SampleBatch.OBS]
        new_actions, logp = call(self.policies[policy_id], params, obs, noise=batch["noise"])
        alpha = batch["alpha"]
        critic = self.critics[policy_id]  # its weights held fixed: gradients reach the actor only
        q = torch.minimum(*call(critic, {k: v.detach() for k, v in critic.named_parameters()}, obs, new_actions))
        actor_loss = (alpha * logp - q).mean()
        return actor_loss, {"actor_loss": actor_loss.detach()}

    def update(self, policy_id: str, batch: SampleBatch) -> dict[str, Any]:
        """Temperature, then critic, then actor step (the reference's order), each its own
        optimizer and ``UpdateStep``; the critic's target and the actor's loss read the
        temperature from before its step (``batch["alpha"]``); the reparameterization noise comes
        from the seeded ``learner_generator``, drawn outside the (possibly compiled) steps."""
        actor_opt, critic_opt, alpha_opt = self.optimizers()
        obs = batch[SampleBatch.OBS]
        shape = (obs.shape[0], int(self.action_space.shape[0]))
        batch = SampleBatch(dict(batch))
        batch["noise"] = torch.randn(shape, generator=self.learner_generator, device=obs.device)
        batch["next_noise"] = torch.randn(shape, generator=self.learner_generator, device=obs.device)
        batch["alpha"] = self.log_alpha[policy_id].detach().exp()  # a new tensor: the step below leaves it
        results: dict[str, Any] = {}
        for name, params, optimizer, loss in (
            ("alpha", {"log_alpha": self.log_alpha[policy_id]}, alpha_opt, self.alpha_loss),
            ("critic", dict(self.critics[policy_id].named_parameters()), critic_opt, self.critic_loss),
            ("actor", dict(self.policies[policy_id].named_parameters()), actor_opt, self.actor_loss),
        ):
            step = self.update_step(f"{name}/{policy_id}", params, optimizer,
                                    policy_loss(loss, policy_id), self.grad_clip, counts_step=name == "actor")
            results.update(step(batch))
        return {"td_error": results.pop("td_error"), "learner_stats": results}

    def update_targets(self) -> None:
        soft_update_(list(self.target_critics.parameters()), list(self.critics.parameters()), self.tau)

