"""Inference outside Lightning: Stable-Baselines3's ``predict`` and a TorchScript export.

Both go through ``compute_actions`` (``ActionAPI``, which every algorithm inherits), the one
action path that samplers, evaluation and users share.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.data.samplers.engine import act

if TYPE_CHECKING:
    import gymnasium as gym

    from lightning_rl.policies import Policies


class Actor(Protocol):
    """What acting outside Lightning reads of a module: its policies, their observation space, its
    one action path and its train/eval mode (every algorithm is one, through ``ActionAPI``)."""

    training: bool

    @property
    def policies(self) -> Policies: ...

    @property
    def observation_space(self) -> gym.Space: ...

    def compute_actions(self, obs: Any, policy_id: str = ..., explore: bool = ..., state: Any = ...,
                        episode_start: Any = ..., prev_action: Any = ..., prev_reward: Any = ...) -> Any: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = ...) -> Any: ...


def predict(
    module: Actor,
    obs: np.ndarray | Tensor,
    state: Any = None,
    episode_start: np.ndarray | None = None,
    deterministic: bool = False,
    policy_id: str = DEFAULT_POLICY_ID,
) -> tuple[np.ndarray | Tensor, Any]:
    """``(actions, state)`` for one observation or a batch, with Stable-Baselines3's signature.

    ``state`` and ``episode_start`` are the recurrent state and episode starts (SB3's
    ``RecurrentPPO``); feed-forward policies take and return ``None``. ``deterministic``
    picks greedy actions; otherwise the policy explores as during training (DQN's epsilon
    included).
    """
    was_training = module.training
    module.eval()
    try:
        if not module.policies.is_recurrent(policy_id):
            return module.compute_actions(obs, policy_id=policy_id, explore=not deterministic), state
        policy = module.policies[policy_id]
        if policy.use_prev_action or policy.use_prev_reward:
            raise ValueError("predict does not know the previous action and reward this policy reads "
                             "(lstm_use_prev_action/lstm_use_prev_reward): call compute_actions(obs, state=..., "
                             "episode_start=..., prev_action=..., prev_reward=...)")
        return module.compute_actions(obs, policy_id=policy_id, explore=not deterministic, state=state,
                                      episode_start=episode_start)
    finally:
        module.train(was_training)


class Acting:
    """Acts in envs with a module's policy, for evaluation and recording: ``act(obs [N, ...])``
    then ``observe(rewards, dones)`` after each step. A recurrent policy's state, previous
    action and reward are carried from step to step and reset where an episode ended."""

    def __init__(self, module: Actor, policy_id: str = DEFAULT_POLICY_ID, explore: bool = False) -> None:
        self.module, self.policy_id, self.explore = module, policy_id, explore
        self.recurrent = module.policies.is_recurrent(policy_id)
        self.state: np.ndarray | None = None
        self.starts: np.ndarray | None = None
        self.prev_action: np.ndarray | None = None
        self.prev_reward: np.ndarray | None = None

    def act(self, obs: np.ndarray) -> np.ndarray:
        if not self.recurrent:
            return self.module.compute_actions(obs, policy_id=self.policy_id, explore=self.explore)
        if self.starts is None:
            self.starts = np.ones(len(obs), dtype=bool)
        actions, self.state = self.module.compute_actions(
            obs, policy_id=self.policy_id, explore=self.explore, state=self.state, episode_start=self.starts,
            prev_action=self.prev_action, prev_reward=self.prev_reward)
        self.prev_action = actions
        return actions

    def observe(self, rewards: Any, dones: Any) -> None:
        if not self.recurrent:
            return
        dones = np.asarray(dones, dtype=bool).reshape(-1)
        self.starts = dones.copy()
        self.prev_reward = np.where(dones, 0.0, np.asarray(rewards, dtype=np.float32).reshape(-1))
        keep = (~dones).reshape(-1, *[1] * (np.ndim(self.prev_action) - 1))
        self.prev_action = np.where(keep, self.prev_action, np.zeros_like(self.prev_action))


class ActionAPI:
    """An algorithm's action path (``Algorithm`` inherits it): ``policy_outputs`` for samplers
    and evaluation, ``compute_actions``, ``predict`` and ``export_policy`` for users. It reads
    the algorithm's ``policies`` (``policies.py``) and ``exploration_kwargs``."""

    def policy_outputs(self, obs: Tensor, policy_id: str = DEFAULT_POLICY_ID, explore: bool = True,
                       generator: torch.Generator | None = None, device: torch.device | str | None = None,
                       inputs: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The one action path, shared by samplers, evaluation and users: the policy's outputs
        (``actions`` and, for actor-critics, ``action_logp``, ``vf_preds``) for a batch
        ``[N, *obs_shape]`` on ``device``, with the algorithm's exploration when ``explore``.
        ``inputs``: a recurrent policy's ``state_in``, ``episode_starts``... (it then returns
        ``state_out``). The policy acts in eval mode; its submodules' modes are restored after."""
        device = self.device if device is None else torch.device(device)
        exploration = self.exploration_kwargs(policy_id) if explore else {}
        return act(self.sampling_policy(policy_id, device), obs, device, explore, generator, inputs, **exploration)

    @torch.no_grad()
    def compute_actions(
        self, obs: np.ndarray | Tensor, policy_id: str = DEFAULT_POLICY_ID, explore: bool = True,
        state: np.ndarray | Tensor | None = None, episode_start: np.ndarray | Tensor | None = None,
        prev_action: np.ndarray | Tensor | None = None, prev_reward: np.ndarray | Tensor | None = None,
    ) -> Any:
        """Actions for a batch ``[N, *obs_shape]`` (or one observation); numpy in, numpy out.
        With a Dict/Tuple observation space, ``obs`` may also be one raw observation or a batch
        in that structure (arrays with a leading ``[N]``): it is flattened as the envs' are.

        A recurrent policy (``use_lstm``) returns ``(actions, next state)``: it reads ``state``
        (``[N, state_size]``; zeros when None), zeroes it where ``episode_start`` (``[N]`` bool),
        and reads the previous action and reward where it was built to (zeros when None)."""
        obs_t, single, inputs = self.policies.action_inputs(obs, policy_id, state, episode_start, prev_action,
                                                            prev_reward)
        out = self.policy_outputs(obs_t, policy_id, explore=explore, inputs=inputs)
        return self.policies.as_given(out, policy_id, single, not isinstance(obs, Tensor), inputs is not None)

    def predict(self, obs: np.ndarray | Tensor, state: Any = None, episode_start: np.ndarray | None = None,
                deterministic: bool = False, policy_id: str = DEFAULT_POLICY_ID) -> tuple[np.ndarray | Tensor, Any]:
        """``(actions, state)`` with Stable-Baselines3's signature (see ``inference.predict``)."""
        return predict(self, obs, state, episode_start, deterministic, policy_id)

    def export_policy(self, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID) -> torch.jit.ScriptModule:
        """Save the greedy policy as TorchScript (see ``inference.export_policy``)."""
        return export_policy(self, path, policy_id)

    def predict_step(self, batch: Any, batch_idx: int = 0, dataloader_idx: int = 0) -> Any:
        """``trainer.predict(model, dataloaders=...)``: the greedy actions of each batch of
        observations (a tensor ``[N, *obs_shape]``, a one-tensor tuple such as a
        ``TensorDataset``'s, or a Dict space's structure), a tensor of ``N`` actions."""
        if isinstance(batch, list | tuple) and len(batch) == 1:
            batch = batch[0]
        if self.policies.is_recurrent(DEFAULT_POLICY_ID):
            raise ValueError(f"trainer.predict acts on each batch alone, and {type(self).__name__}'s recurrent policy "
                             "needs its state from step to step: use model.predict(obs, state, episode_start, "
                             "deterministic=True)")
        return self.compute_actions(batch, explore=False)

    def predict_dataloader(self) -> Any:
        raise ValueError("trainer.predict(model) needs observations: trainer.predict(model, dataloaders="
                         "DataLoader(observations, batch_size=...)) returns each batch's greedy actions; or use "
                         "model.predict(obs, deterministic=True)")


class _GreedyPolicy(nn.Module):
    """``obs -> greedy actions`` of a policy, as one traceable forward."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: Tensor) -> Tensor:
        return self.policy.compute_actions(obs, explore=False)["actions"].detach()


def export_policy(
    module: Actor, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID
) -> torch.jit.ScriptModule:
    """Save the greedy policy as TorchScript: ``torch.jit.load(path)(obs_batch) -> actions``,
    runnable without Python, Lightning or this library."""
    if module.policies.is_recurrent(policy_id):
        raise ValueError("export_policy exports a feed-forward policy (obs -> actions); a recurrent one needs its "
                         "state: use predict or compute_actions")
    greedy = _GreedyPolicy(copy.deepcopy(module.policies[policy_id]).cpu().eval())
    example = torch.as_tensor(np.stack([module.observation_space.sample() for _ in range(2)]))
    with torch.no_grad():
        scripted = torch.jit.trace(greedy, example, check_trace=False)
    scripted.save(str(path))
    return scripted
