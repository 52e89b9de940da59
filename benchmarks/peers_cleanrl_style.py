"""PPO for CartPole-v1 in one readable file, in the style of CleanRL (written from scratch here).

A baseline for ``benchmarks/peers.py``: a plain loop of rollout, GAE, and epochs of the clipped
loss with Adam, with no framework around it. Its defaults are the settings ``peers.py`` gives every
implementation (rl-baselines3-zoo's CartPole PPO with a constant learning rate and clip range):

* a gymnasium ``SyncVectorEnv`` of 8 envs, 32 steps per env per iteration (256 rows);
* 20 epochs of one minibatch of 256; Adam (eps 1e-5), lr 1e-3 and clip 0.2, both constant;
* gamma 0.98, GAE lambda 0.8; advantages standardized per minibatch (here: the whole batch);
* loss ``pg_loss + 0.5 * mean((V - target)^2) - 0.0 * entropy`` (no extra 1/2 on the squared
  error, as lightning_rl, Stable-Baselines3 and skrl; CleanRL's own ppo.py has one); gradients
  clipped to global norm 0.5;
* separate actor and critic MLPs, 64-64 tanh, orthogonal init (gain sqrt(2), heads 0.01 and 1).

Episode ends: the vector env resets an env in the step that ends its episode (``SAME_STEP``); a
truncated episode (CartPole's 500-step limit) is bootstrapped by adding ``gamma * V(final_obs)``
to its last reward, as Stable-Baselines3 does, while a terminated one is not. (CleanRL's ppo.py
treats both as terminal.)

Usage::

    python benchmarks/peers_cleanrl_style.py                       # 100k env steps, seed 0
    python benchmarks/peers_cleanrl_style.py --total-timesteps 2048 --seed 1

It prints one JSON line: env steps, loop seconds and steps/s, episodes finished, the mean training
return of the last 20 episodes, and the mean and std of 10 greedy episodes on a fresh env.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    seed: int = 0
    total_timesteps: int = 100_000  # rounded up to whole iterations of num_envs * num_steps
    num_envs: int = 8
    num_steps: int = 32  # per env per iteration
    update_epochs: int = 20
    num_minibatches: int = 1
    learning_rate: float = 1e-3
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    threads: int = 1  # torch.set_num_threads

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return math.ceil(self.total_timesteps / self.batch_size)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, head_std: float, hidden: int = 64) -> nn.Sequential:
    """``in_dim -> 64 -> tanh -> 64 -> tanh -> out_dim``, orthogonally initialized."""
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, hidden)), nn.Tanh(),
        layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
        layer_init(nn.Linear(hidden, out_dim), std=head_std),
    )


class Agent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int) -> None:
        super().__init__()
        self.critic = mlp(obs_dim, 1, head_std=1.0)
        self.actor = mlp(obs_dim, num_actions, head_std=0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)

    def greedy_action(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(x).argmax(-1)


def make_envs(args: Args) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(args.env_id) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def greedy_returns(act: Callable[[np.ndarray], int], env_id: str, seed: int, episodes: int = 10) -> list[float]:
    """Returns of ``episodes`` episodes on one fresh env, the first reset seeded with ``seed``;
    ``act`` maps one observation to one action (greedy, no exploration)."""
    env = gym.make(env_id)
    returns = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        obs, _ = env.reset()
    env.close()
    return returns


def train(args: Args, envs: gym.vector.SyncVectorEnv | None = None) -> tuple[Agent, dict]:
    """Trains an agent; returns it and the run's figures (``loop_s``: the iterations' wall time)."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    envs = make_envs(args) if envs is None else envs
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N, obs_dim))
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs = torch.zeros((T, N))
    rewards = torch.zeros((T, N))
    dones = torch.zeros((T, N))  # the episode ended at this step (terminated or truncated)
    values = torch.zeros((T, N))

    episode_return = np.zeros(N)
    finished_returns: list[float] = []
    global_step = 0
    start = time.perf_counter()
    next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0], dtype=torch.float32)
    for _ in range(args.num_iterations):
        # ---- rollout
        for step in range(T):
            global_step += N
            obs[step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value
            next_obs_np, env_reward, terminated, truncated, infos = envs.step(action.numpy())
            episode_return += env_reward
            reward = torch.as_tensor(env_reward, dtype=torch.float32)
            cut = truncated & ~terminated
            if cut.any():  # time limit: bootstrap from the value of the true last observation
                final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut]), dtype=torch.float32)
                with torch.no_grad():
                    reward[torch.as_tensor(cut)] += args.gamma * agent.get_value(final_obs)
            rewards[step] = reward
            done = terminated | truncated
            dones[step] = torch.as_tensor(done, dtype=torch.float32)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
            finished_returns.extend(episode_return[done].tolist())
            episode_return[done] = 0.0

        # ---- GAE, backwards through the rollout
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(N)
            for t in reversed(range(T)):
                nextnonterminal = 1.0 - dones[t]
                nextvalues = next_value if t == T - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        # ---- epochs of minibatch updates on the flattened batch
        b_obs = obs.reshape(-1, obs_dim)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        minibatch_size = args.batch_size // args.num_minibatches
        for _ in range(args.update_epochs):
            order = torch.randperm(args.batch_size)
            for begin in range(0, args.batch_size, minibatch_size):
                mb = order[begin:begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_advantages = b_advantages[mb]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss = torch.max(
                    -mb_advantages * ratio,
                    -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                ).mean()
                v_loss = ((newvalue - b_returns[mb]) ** 2).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy.mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

    loop_s = time.perf_counter() - start
    envs.close()
    last = finished_returns[-20:]
    return agent, {
        "env_steps": global_step,
        "loop_s": loop_s,
        "loop_steps_per_s": global_step / loop_s,
        "episodes": len(finished_returns),
        "last20_train_return": float(np.mean(last)) if last else None,
    }


def greedy_act(agent: Agent) -> Callable[[np.ndarray], int]:
    def act(obs: np.ndarray) -> int:
        with torch.no_grad():
            return int(agent.greedy_action(torch.as_tensor(obs, dtype=torch.float32)))

    return act


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    args = Args(**vars(parser.parse_args(argv)))
    agent, stats = train(args)
    returns = greedy_returns(greedy_act(agent), args.env_id, seed=args.seed + 10_000)
    stats.update(greedy_return_mean=float(np.mean(returns)), greedy_return_std=float(np.std(returns)))
    print(json.dumps({"seed": args.seed, **stats}))


if __name__ == "__main__":
    main()
