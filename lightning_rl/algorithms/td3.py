"""Twin Delayed DDPG (Fujimoto et al. 2018, https://arxiv.org/abs/1802.09477), and DDPG
(Lillicrap et al. 2016) as TD3 with its three changes switched off."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from pytorch_lightning.trainer.states import TrainerStatus
from torch import Tensor, nn

from lightning_rl.algorithms.off_policy import ContinuousOffPolicyModule
from lightning_rl.batch import DEFAULT_POLICY_ID, SampleBatch
from lightning_rl.checkpoint_data import pack_rank_states, unpack_rank_state
from lightning_rl.functional import clipped_double_q_target, smoothed_target_actions, soft_update_
from lightning_rl.nn.q_models import DeterministicActor, OrnsteinUhlenbeckNoise, TwinQ
from lightning_rl.settings import at_least, one_of, setting, settings
from lightning_rl.update import call, policy_loss

ACTION_NOISES = ("normal", "ornstein-uhlenbeck", None)


@settings
class TD3(ContinuousOffPolicyModule):
    """TD3 for Box actions of any bounds; defaults are Stable-Baselines3's (rl-zoo's Pendulum-v1 network).

    Per replay minibatch (actions in ``[-1, 1]``, scaled to the bounds only at the env)::

        eps         = clip(N(0, target_policy_noise^2), -target_noise_clip, target_noise_clip)
        a'          = clip(pi_target(s') + eps, -1, 1)
        target      = R + gamma^k (1 - terminated) min_i Q_target_i(s', a')
        critic_loss = mean(weights * sum_i (Q_i(s, a) - target)^2)
        actor_loss  = -mean(Q_1(s, pi(s)))                    # every policy_delay-th update only

    and, after each actor step, the target actor and critics move toward the online ones by Polyak
    averaging with ``tau``. The three changes TD3 makes to DDPG are settings: ``twin_q`` (clipped
    double Q), ``target_policy_noise`` (target policy smoothing) and ``policy_delay`` (delayed actor
    and target updates); ``DDPG`` is this class with all three off. An update is one of Lightning's
    optimizer steps (``trainer.global_step``): the critics'; the actor's is not counted.
    Exploration: the replay acts uniformly at random for ``learning_starts`` env steps, then the
    actor acts with ``action_noise`` added in the ``[-1, 1]`` scale (clipped there); evaluation
    and ``predict(deterministic=True)`` act without noise.
    """

    lr: float = 1e-3
    """Adam's learning rate of the actor and the critics."""
    hiddens: Sequence[int] = (400, 300)
    target_network_update_freq: int = 0
    """global env steps between Polyak updates (0: after every actor update)."""
    tau: float = 0.005
    """Polyak coefficient of the target actor and critics, per actor update."""
    policy_delay: int = setting(default=2, check=at_least(1))
    """critic updates per actor (and target) update (1: DDPG's every update)."""
    target_policy_noise: float = setting(default=0.2, check=at_least(0))
    """standard deviation of the target policy smoothing noise (``[-1, 1]`` units; 0: off)."""
    target_noise_clip: float = setting(default=0.5, check=at_least(0))
    """the smoothing noise is clipped to +- this."""
    action_noise: str | None = setting(default="normal", check=one_of(*ACTION_NOISES))
    """exploration noise added to the actor's actions: ``normal``, ``ornstein-uhlenbeck`` or ``None``."""
    action_noise_sigma: float = setting(default=0.1, check=at_least(0))
    """the exploration noise's standard deviation (``[-1, 1]`` action units; OU's sigma)."""
    twin_q: bool = True
    """two critics and the minimum of their targets (clipped double Q); False: one critic (DDPG)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        space = self.action_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            raise ValueError(f"unsupported action space {space}: {type(self).__name__} needs 1-D Box actions")
        action_noise, sigma = self.action_noise, self.action_noise_sigma
        self.noise: str | OrnsteinUhlenbeckNoise | None = (
            OrnsteinUhlenbeckNoise(sigma) if action_noise == "ornstein-uhlenbeck" else action_noise)
        with torch.random.fork_rng():
            if self.seed is not None:
                torch.manual_seed(self.seed)
            self.policies[DEFAULT_POLICY_ID] = DeterministicActor(
                self.observation_space, space, self.hiddens, self.activation, self.encoder)
            self.critics = nn.ModuleDict({DEFAULT_POLICY_ID: TwinQ(
                self.observation_space, int(space.shape[0]), self.hiddens, self.activation, self.encoder,
                num_q=2 if self.twin_q else 1)})
        self.target_actors = nn.ModuleDict({DEFAULT_POLICY_ID: copy.deepcopy(self.policies[DEFAULT_POLICY_ID])})
        self.target_actors.requires_grad_(False)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self._actor_updated = False

    def configure_optimizers(self) -> Any:
        pid = DEFAULT_POLICY_ID
        return [torch.optim.Adam(self.policies[pid].parameters(), lr=self.lr, fused=True),
                torch.optim.Adam(self.critics[pid].parameters(), lr=self.lr, fused=True)]

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        return {"action_noise": self.noise, "action_noise_sigma": self.action_noise_sigma}

    def critic_loss(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None) -> Any:
        """The (clipped double-Q) Bellman error at smoothed target actions, weighted by the replay's
        importance weights."""
        actor, critic = self.policies[policy_id], self.critics[policy_id]
        with torch.no_grad():
            next_obs = batch[SampleBatch.NEXT_OBS]
            next_actions = smoothed_target_actions(self.target_actors[policy_id](next_obs), batch["target_noise"],
                                                   self.target_noise_clip)
            target = clipped_double_q_target(batch[SampleBatch.REWARDS], batch[SampleBatch.DISCOUNTS],
                                             batch[SampleBatch.TERMINATEDS],
                                             self.target_critics[policy_id](next_obs, next_actions))
        qs = call(critic, params, batch[SampleBatch.OBS], actor.normalize(batch[SampleBatch.ACTIONS]))
        critic_loss = (batch[SampleBatch.WEIGHTS] * sum((q - target).pow(2) for q in qs)).mean()
        return critic_loss, {"critic_loss": critic_loss.detach(), "mean_q": qs[0].detach().mean(),
                             "td_error": (qs[0] - target).detach()}

    def actor_loss(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None) -> Any:
        """``-Q_1(s, pi(s))`` (the critics just stepped; their weights held fixed)."""
        obs = batch[SampleBatch.OBS]
        actions = call(self.policies[policy_id], params, obs)
        critic = self.critics[policy_id]  # gradients reach the actor only
        actor_loss = -call(critic, {k: v.detach() for k, v in critic.named_parameters()}, obs, actions)[0].mean()
        return actor_loss, {"actor_loss": actor_loss.detach()}

    def update(self, policy_id: str, batch: SampleBatch) -> dict[str, Any]:
        """A critic step, then, on every ``policy_delay``-th critic update, an actor step (each its own
        optimizer and ``UpdateStep``); the smoothing noise comes from the seeded ``learner_generator``,
        drawn outside the (possibly compiled) steps."""
        actor_opt, critic_opt = self.optimizers()
        obs = batch[SampleBatch.OBS]
        shape = (obs.shape[0], int(self.action_space.shape[0]))
        batch = SampleBatch(dict(batch))
        batch["target_noise"] = (self.target_policy_noise * torch.randn(
            shape, generator=self.learner_generator, device=obs.device) if self.target_policy_noise > 0
            else torch.zeros(shape, device=obs.device))
        critic_step = self.update_step(f"critic/{policy_id}", dict(self.critics[policy_id].named_parameters()),
                                       critic_opt, policy_loss(self.critic_loss, policy_id), self.grad_clip)
        results = critic_step(batch)
        # counters["num_grad_updates"] counts the updates before this one (saved, the same on every rank)
        self._actor_updated = (self.counters["num_grad_updates"] + 1) % self.policy_delay == 0
        if self._actor_updated:
            actor_step = self.update_step(f"actor/{policy_id}", dict(self.policies[policy_id].named_parameters()),
                                          actor_opt, policy_loss(self.actor_loss, policy_id), self.grad_clip,
                                          counts_step=False)
            results.update(actor_step(batch))
        return {"td_error": results.pop("td_error"), "learner_stats": results}

    def target_update_due(self) -> bool:
        return self._actor_updated and super().target_update_due()  # the targets follow the delayed actor

    def update_targets(self) -> None:
        soft_update_([*self.target_actors.parameters(), *self.target_critics.parameters()],
                     [*self.policies.parameters(), *self.critics.parameters()], self.tau)

    # The Ornstein-Uhlenbeck process's state differs per DDP rank: saved per rank, beside the envs.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if isinstance(self.noise, OrnsteinUhlenbeckNoise):
            interrupted = self._trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
            states = list(self.noise.states.values())  # each tensor's shape is its key
            checkpoint["lightning_rl"]["action_noise"] = pack_rank_states({"states": states}, interrupted)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if isinstance(self.noise, OrnsteinUhlenbeckNoise):
            trainer = self._trainer
            rank, size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
            mine = unpack_rank_state(checkpoint.get("lightning_rl", {}).get("action_noise"), rank, size,
                                     "exploration noise", warn=False)
            self.noise.states = {} if mine is None else {tuple(t.shape): t for t in mine["states"]}


@settings
class DDPG(TD3):
    """DDPG (Lillicrap et al. 2016): TD3 with one critic (``twin_q=False``), no target policy
    smoothing (``target_policy_noise=0``) and an actor and target update after every critic update
    (``policy_delay=1``), as Stable-Baselines3's DDPG is its TD3 with those defaults."""

    policy_delay: int = 1
    target_policy_noise: float = 0.0
    twin_q: bool = False
