"""Atari (``env="ALE/Breakout-v5"``, any ALE id): the standard preprocessing by default, each
step switchable through ``env_kwargs``, and episode statistics of whole games' raw scores.

``make_atari`` builds, around ALE's env made with ``frameskip=1``:

1. gymnasium's ``AtariPreprocessing``: up to ``noop_max`` (30) no-op actions at the start of a
   game, ``frame_skip`` (4) repeats of each action with the max over the last two frames,
   ``screen_size`` (84) square frames, grayscale (``grayscale=True``);
2. ``GameScore``: the raw score and length of each whole game, reported in ``info``
   (``game_score``, ``game_length``) when the game ends: what ``rollout/episode_return_mean``,
   evaluation and the progress bar show;
3. ``LifeLossEnds`` (``episodic_life=True``): the loss of a life ends an episode for learning
   (``terminated``; the next reset continues the game) — Mnih et al. 2015's setting;
4. ``FireReset`` (``fire_reset=True``, for games whose action 1 is FIRE): FIRE after every
   reset, the game's own and a lost life's, since Breakout-like games wait for it (a greedy
   policy that never fires would otherwise play until the time limit);
5. ``clip_rewards=True``: the sign of each reward, which is what the losses see;
6. ``frame_stack`` (4) last frames, stacked channels first (``(4, 84, 84)`` uint8; with color,
   ``(84, 84, 3 * frame_stack)``), the first stack of an episode padded with copies of its first
   frame (gymnasium's ``FrameStackObservation``). A grayscale stack says so in the env's
   metadata (``frame_stack``), so that the replay stores each frame once
   (``data/buffers/frames.py``).

ALE's v5 defaults stay: sticky actions (``repeat_action_probability=0.25``) and the minimal
action set, as Machado et al. 2018 recommend for evaluation that a memorized sequence of
actions cannot game; pass ``env_kwargs={"repeat_action_probability": 0.0}`` for the
deterministic v4-style setting of the older papers. Other keyword arguments go to
``gymnasium.make`` (``full_action_space``, ``mode``, ``difficulty``...). Needs ``ale-py``
(``pip install "lightning-rl[atari]"``), whose wheels carry the ROMs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` names an ALE env (``ALE/...``)."""
    return env_id.startswith("ALE/")


def register_ale(env_id: str) -> None:
    """Register ALE's envs with gymnasium (importing ``ale_py``); an error names the env."""
    try:
        import ale_py
    except ImportError as err:
        raise ValueError(f"env {env_id!r} needs ale-py: pip install 'lightning-rl[atari]'") from err
    gym.register_envs(ale_py)


def make_atari(
    env_id: str,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    grayscale: bool = True,
    frame_stack: int = 4,
    episodic_life: bool = True,
    fire_reset: bool = True,
    clip_rewards: bool = True,
    **make_kwargs: Any,
) -> gym.Env:
    """An ALE env with the preprocessing of the module docstring, each step switchable."""
    register_ale(env_id)
    if frame_skip < 1 or frame_stack < 1 or screen_size < 1 or noop_max < 0:
        raise ValueError(f"{env_id}: frame_skip, frame_stack and screen_size must be >= 1 and noop_max >= 0, got "
                         f"{frame_skip}, {frame_stack}, {screen_size}, {noop_max}")
    env = gym.make(env_id, frameskip=1, **make_kwargs)  # the frame skip is the wrapper's, with max-pooling
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                                          grayscale_obs=grayscale, terminal_on_life_loss=False, scale_obs=False)
    env = GameScore(env)
    if episodic_life:
        env = LifeLossEnds(env)
    if fire_reset and env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]:
        env = FireReset(env)
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, np.sign)
    if frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, frame_stack)
        if grayscale:
            env.metadata = {**env.metadata, "frame_stack": frame_stack}
        else:  # (stack, H, W, 3) -> (H, W, 3 * stack): one image, HWC
            h, w = screen_size, screen_size
            space = gym.spaces.Box(0, 255, (h, w, 3 * frame_stack), np.uint8)
            env = gym.wrappers.TransformObservation(
                env, lambda obs: np.ascontiguousarray(np.moveaxis(obs, 0, 2).reshape(h, w, -1)), space)
    return env


class GameScore(gym.Wrapper):
    """The raw score and length (agent steps) of each whole game, put in ``info`` as
    ``game_score`` and ``game_length`` at the step the game ends; nothing else changes."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.metadata = {**env.metadata, "game_scores": True}  # read by EpisodeStatistics via the vector env
        self._score, self._length = 0.0, 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._score, self._length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._score += float(reward)
        self._length += 1
        if terminated or truncated:
            info = {**info, "game_score": self._score, "game_length": self._length}
        return obs, reward, terminated, truncated, info


class LifeLossEnds(gym.Wrapper):
    """The loss of a life ends the episode (``terminated``) without ending the game: the reset
    that follows plays one no-op and goes on from there (a real reset only after game over).
    A game that ends on that no-op (its last life lost, its time limit reached) is reset for real,
    and the reset's ``info`` carries the ended game's ``game_score`` and ``game_length``
    (``GameScore``), so the statistics still count it."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        ended: dict[str, Any] = {}
        if not self._game_over:
            obs, _, terminated, truncated, info = self.env.step(0)
            if not (terminated or truncated):
                self._lives = self.env.unwrapped.ale.lives()
                return obs, info
            ended = game_end(info)
        obs, info = self.env.reset(**kwargs)
        if ended:
            info = {**info, **ended}
        self._game_over = False
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        return obs, reward, terminated, truncated, info


def game_end(info: dict[str, Any]) -> dict[str, Any]:
    """The ``game_score`` and ``game_length`` ``GameScore`` put in ``info``, if a game ended."""
    return {k: info[k] for k in ("game_score", "game_length") if k in info}


class FireReset(gym.Wrapper):
    """Press FIRE (action 1) after each reset; a reset again if that ended the episode. A game
    that ended in the reset (``LifeLossEnds``' no-op) or on the FIRE keeps its ``game_score``
    and ``game_length`` in the ``info`` returned, so the statistics still count it."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        _, info = self.env.reset(**kwargs)
        ended = game_end(info)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            ended = game_end(info) or ended
            obs, info = self.env.reset(**kwargs)
        return obs, {**ended, **info}  # a game that ended last wins (a reset reports one)
