"""Deep Q-Networks (Mnih et al. 2015) with double Q (van Hasselt et al. 2016), dueling heads
(Wang et al. 2016), n-step returns and prioritized replay (Schaul et al. 2016)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from lightning_rl.algorithms.off_policy import OffPolicyModule
from lightning_rl.batch import SampleBatch
from lightning_rl.functional import double_q_target, huber_loss, soft_update_
from lightning_rl.nn.encoders import Activation
from lightning_rl.nn.q_models import QNetwork
from lightning_rl.settings import Schedule, interval, setting, settings
from lightning_rl.update import call, policy_loss


@settings
class DQN(OffPolicyModule):
    """DQN with double Q, dueling heads, 3-step returns and a learning rate decayed linearly to 0
    at ``total_env_steps`` by default: settings that solve CartPole-v1 greedily within about 25k
    env steps and keep it solved to the end of a 60k budget (rl-zoo's plain-DQN settings do not,
    for Stable-Baselines3 either; with a constant learning rate most seeds fall back after solving).

    Loss per replay minibatch::

        td_error = Q(s, a) - (R + gamma^k * (1 - terminated) * Q_target(s', a*))
        loss     = mean(weights * huber(td_error))

    with ``a* = argmax_a Q(s', a)`` under ``double_q`` (else under ``Q_target``).
    """

    num_envs: int = 1
    total_env_steps: int | None = 60_000
    iterations_per_epoch: int = 50
    lr: float = 1e-3
    lr_schedule: Schedule = None
    """``linear`` to 0 at ``total_env_steps`` (default if set), ``constant`` or ``[[env_step, lr], ...]``."""
    grad_clip: float | None = 10.0
    hiddens: Sequence[int] = (256, 256)
    """MLP layer sizes of the Q-network."""
    activation: Activation = "relu"
    """the MLP's activation: a name such as ``relu`` or an import path."""
    policies: Sequence[str] | dict[str, dict[str, Any]] | None = None  # type: ignore[assignment]
    """multi-agent: policy ids or ``{id: settings}``; each policy has its own replay, Q-network and target."""
    double_q: bool = True
    """pick the bootstrap action with the online network (double DQN)."""
    dueling: bool = True
    """dueling heads, ``Q = V + A - mean(A)``."""
    epsilon_start: float = setting(default=1.0, check=interval("[0, 1]"))
    """epsilon-greedy's epsilon at the start (every exploring action: sampling, ``predict`` ...)."""
    epsilon_end: float = setting(default=0.02, check=interval("[0, 1]"))
    """epsilon-greedy's epsilon after ``epsilon_timesteps``."""
    epsilon_timesteps: int = 10_000
    """global env steps over which epsilon falls linearly from ``epsilon_start`` to ``epsilon_end``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.build_policies(QNetwork, hiddens=self.hiddens, activation=self.activation, dueling=self.dueling,
                            encoder=self.encoder)
        self.target_q = copy.deepcopy(self.policies).requires_grad_(False)
        self.epsilon_points = [(0.0, self.epsilon_start), (float(max(self.epsilon_timesteps, 1)), self.epsilon_end)]

    supports_multi_agent = True  # per-policy replay (MultiAgentReplayDataModule)
    lr_schedule_unset = "linear"  # a constant rate loses what was learned: most seeds fall back after solving

    def configure_optimizers(self) -> Any:
        return [torch.optim.Adam(self.policies[pid].parameters(), lr=self.lr, fused=True)
                for pid in self.policies_to_train]

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        return {"epsilon": self.current(self.epsilon_points, 0.0)}

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, torch.Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The TD loss of one replay minibatch and its results (``learner_stats``, ``td_error``);
        ``params`` replaces the online network's parameters (the compiled step)."""
        q_net, target_net = self.policies[policy_id], self.target_q[policy_id]
        q_all = call(q_net, params, batch[SampleBatch.OBS])
        q = q_all.gather(-1, batch[SampleBatch.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_obs = batch[SampleBatch.NEXT_OBS]
            next_target_q = target_net(next_obs)
            chooser = call(q_net, params, next_obs) if self.double_q else next_target_q
            target = double_q_target(batch[SampleBatch.REWARDS], batch[SampleBatch.DISCOUNTS],
                                     batch[SampleBatch.TERMINATEDS], next_target_q, chooser)
        td_error = q - target
        loss = (batch[SampleBatch.WEIGHTS] * huber_loss(td_error)).mean()
        q = q.detach()
        stats = {"loss": loss.detach(), "mean_q": q.mean(), "max_q": q.max(), "min_q": q.min()}
        return loss, {"learner_stats": stats, "td_error": td_error.detach()}

    def update(self, policy_id: str, batch: SampleBatch) -> dict[str, Any]:
        step = self.update_step(
            f"q/{policy_id}", dict(self.policies[policy_id].named_parameters()), self.policy_optimizer(policy_id),
            policy_loss(self.loss, policy_id),
            self.grad_clip,
        )
        results = step(batch)
        results["learner_stats"]["cur_epsilon"] = self.exploration_kwargs(policy_id)["epsilon"]
        return results

    def update_targets(self) -> None:
        soft_update_(list(self.target_q.parameters()), list(self.policies.parameters()), self.tau)
