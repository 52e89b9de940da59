"""envpool as a vector backend (``vectorization="envpool"``): envpool's C++ batched envs
presented as a gymnasium vector env with next-step autoreset (``EnvPoolVectorEnv``), for the
ids envpool provides: ALE ids (``"ALE/Pong-v5"``, envpool's ``"Pong-v5"``), classic control
(``"CartPole-v1"``, ``"Pendulum-v1"``...) and MuJoCo (``"Hopper-v4"``...).

envpool's own autoreset is already next-step: the step after an episode's end ignores its
action, resets that env and returns the first observation with reward 0, neither terminated
nor truncated; so steps pass through. What the adapter adds, so both backends mean the same:

- seeding: envpool seeds its envs when it builds them (env ``j`` with ``seed + j``) and ignores
  ``reset(seed=...)``; here a reset with a seed rebuilds the pool with that seed, so
  ``reset(seed=s)`` starts reproducible streams as gymnasium's vector envs do (the first reset
  without one draws a seed from OS entropy);
- Atari: the ``env_kwargs`` of the gymnasium path (``atari.make_atari``) mapped onto envpool's
  options (``ATARI_OPTIONS``), with the same defaults (ALE v5's sticky actions, 108,000 frames
  per game); whole games' raw scores in ``info`` (``game_score``, ``game_length``) as
  ``atari.GameScore`` reports them, summed from envpool's unclipped ``info["reward"]`` up to
  its game-over flag ``info["terminated"]`` (or the time limit); frames laid out as on the
  gymnasium path: ``(frame_stack, H, W)`` grayscale, ``(H, W)`` for one grayscale frame,
  ``(H, W, 3 * frame_stack)`` in color;
- env state: none can be saved (envpool keeps its envs in C++ and has no API to read or write
  them), so a checkpoint holds none and a resumed run restarts its episodes with a warning
  (``env_state_unsupported``, read by ``state.capture_env_state``).

Where the backends still differ, by envpool's design: FIRE at a reset (``fire_reset``) is one
frame in envpool, which ALE's sticky actions replace by the previous action one time in four
(``repeat_action_probability=0.25``): the game then waits for the agent's own FIRE, which a
policy that samples its actions soon presses; the gymnasium path presses FIRE for one agent
step (``frame_skip`` frames, each sticky on its own). Greedy evaluation (``evaluation.evaluate``)
plays that step on envpool too: the vector env names the game's FIRE action in its metadata
(``fire_after_reset``; read from the game's ROM with ale-py, the gymnasium path's dependency:
without ale-py none is named) and evaluation starts every episode and life with a no-op step
then a FIRE step (a FIRE held on from envpool's own FIRE frame is no new press), so that a greedy
policy that never fires (Breakout's ball waits) does not play on to the time limit with a score
of 0. After a lost
life (``episodic_life``) envpool plays its random no-op frames again before the game goes on,
the gymnasium path one no-op step; envpool cannot take ``noop_max=0`` and plays it as
``noop_max=1`` (one no-op frame, none before FIRE), which is no random start either. With
``noop_max=1, fire_reset=False, episodic_life=False`` and no sticky actions both play the same
frames (``tests/test_envpool.py``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

INSTALL = "pip install 'lightning-rl[envpool]'"
#: ALE v5's limit of frames per game (its ``max_num_frames_per_episode``), the gymnasium path's too.
ALE_MAX_FRAMES = 108_000
#: The gymnasium path's Atari ``env_kwargs`` (``atari.make_atari``) and their defaults.
ATARI_DEFAULTS = dict(noop_max=30, frame_skip=4, screen_size=84, grayscale=True, frame_stack=4, episodic_life=True,
                      fire_reset=True, clip_rewards=True, repeat_action_probability=0.25,
                      max_num_frames_per_episode=ALE_MAX_FRAMES)
#: Each Atari ``env_kwargs`` key -> envpool's option of the same meaning.
ATARI_OPTIONS = dict(noop_max="noop_max", frame_skip="frame_skip", screen_size=("img_height", "img_width"),
                     grayscale="gray_scale", frame_stack="stack_num", episodic_life="episodic_life",
                     fire_reset="use_fire_reset", clip_rewards="reward_clip",
                     repeat_action_probability="repeat_action_probability",
                     max_num_frames_per_episode="max_episode_steps", full_action_space="full_action_space",
                     mode="mode", difficulty="difficulty")
# set by the adapter itself, never by env_kwargs
_MANAGED = {"num_envs", "batch_size", "seed", "env_seed", "base_path", "task", "max_num_players",
            "gym_reset_return_info"}
_SEED_RANGE = 2**31 - 2**20  # envpool seeds are C ints: seed + env index must not overflow


def import_envpool() -> Any:
    """The ``envpool`` module, or an ``ImportError`` saying how to install it."""
    try:
        import envpool
    except ImportError as err:
        raise ImportError(f"vectorization='envpool' needs envpool: {INSTALL}") from err
    return envpool


def envpool_task(env_id: str) -> tuple[str, bool]:
    """``(envpool's task id, whether it is an Atari game)`` of ``env_id``; a ``ValueError``
    naming the env when envpool does not provide it."""
    envpool = import_envpool()
    specs = envpool.registration.registry.specs
    atari = env_id.startswith("ALE/")
    task = env_id.removeprefix("ALE/")
    if task in specs and specs[task][0] == "envpool.atari" and not atari:
        raise ValueError(f"env {env_id!r}: name Atari games as gymnasium does, 'ALE/{task}', with "
                         "vectorization='envpool' too")
    if task not in specs or atari != (specs[task][0] == "envpool.atari"):
        raise ValueError(f"vectorization='envpool': envpool provides no env {env_id!r} (it has ALE ids such as "
                         "'ALE/Pong-v5', classic control and MuJoCo ids; envpool.list_all_envs() lists them); "
                         "use vectorization='sync' for it")
    return task, atari


def envpool_options(env_id: str, task: str, atari: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    """envpool's options for ``env_kwargs``: an Atari game's are mapped (``ATARI_OPTIONS``) over
    the gymnasium path's defaults; any other key must be one of envpool's own options for the
    task. A ``ValueError`` names the keys envpool does not take."""
    known = set(_spec(task)._config_keys) - _MANAGED
    options: dict[str, Any] = {}
    rest = dict(kwargs)
    if atari:
        given = {**ATARI_DEFAULTS, **{k: rest.pop(k) for k in list(rest) if k in ATARI_OPTIONS}}
        frame_skip, frame_stack, size, noop_max = (given[k] for k in ("frame_skip", "frame_stack", "screen_size",
                                                                      "noop_max"))
        if frame_skip < 1 or frame_stack < 1 or size < 1 or noop_max < 0:
            raise ValueError(f"{env_id}: frame_skip, frame_stack and screen_size must be >= 1 and noop_max >= 0, "
                             f"got {frame_skip}, {frame_stack}, {size}, {noop_max}")
        given["noop_max"] = max(noop_max, 1)  # envpool cannot take 0; 1 is no random start either
        given["max_num_frames_per_episode"] = max(given["max_num_frames_per_episode"] // frame_skip, 1)
        for key, value in given.items():
            for option in (ATARI_OPTIONS[key],) if isinstance(ATARI_OPTIONS[key], str) else ATARI_OPTIONS[key]:
                options[option] = value
        known -= set(options)
    unknown = sorted(set(rest) - known)
    if unknown:
        takes = sorted(known | (set(ATARI_OPTIONS) if atari else set()))
        raise ValueError(f"env {env_id!r} with vectorization='envpool': envpool takes no {', '.join(unknown)}; "
                         f"it takes {', '.join(takes)}")
    return {**options, **rest}


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of envpool's ``task`` (module docstring), built at the first reset.

    Args:
        task: envpool's task id (``envpool_task``).
        num_envs: envs stepped together.
        options: envpool's options (``envpool_options``).
        atari: report whole games' raw scores in ``info`` and lay frames out as the gymnasium path.
    """

    env_state_unsupported = "is envpool's, which keeps its envs' state in C++ with no API to save or restore it"

    def __init__(self, task: str, num_envs: int, options: dict[str, Any], atari: bool) -> None:
        self.task, self.num_envs, self.options, self.atari = task, num_envs, dict(options), atari
        spec = _spec(task, **options)
        with _quiet_spaces():
            pool_space, action_space = spec.gymnasium_observation_space, spec.gymnasium_action_space
        self._layout = self._frame_layout(pool_space) if atari else None
        if self._layout == "hw":
            pool_space = gym.spaces.Box(0, 255, pool_space.shape[1:], np.uint8)
        elif self._layout == "hwc":
            pool_space = gym.spaces.Box(0, 255, (*pool_space.shape[1:], pool_space.shape[0]), np.uint8)
        self.single_observation_space = pool_space
        self.single_action_space = action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "game_scores": atari}
        fire = fire_action(spec) if atari else None
        if fire is not None:  # pressed by evaluation after each reset (module docstring)
            self.metadata["fire_after_reset"] = fire
        #: agent steps after which envpool truncates an episode (an Atari game), as ``TimeLimit`` does
        self.max_episode_steps: int | None = int(getattr(spec.config, "max_episode_steps", 0) or 0) or None
        if self._layout == "chw":  # a grayscale frame stack, as the gymnasium path declares it (replay_frame_stack)
            self.metadata["frame_stack"] = pool_space.shape[0]
        self.pool: Any = None  # envpool's, built at the first reset and at each seeded one
        self._score = np.zeros(num_envs)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self._prev_done = np.zeros(num_envs, dtype=bool)

    def _frame_layout(self, space: gym.spaces.Box) -> str:
        if not self.options.get("gray_scale", True):
            return "hwc"
        return "hw" if space.shape[0] == 1 else "chw"

    def _frames(self, obs: np.ndarray) -> np.ndarray:
        if self._layout == "hw":
            return obs[:, 0]
        if self._layout == "hwc":
            return np.ascontiguousarray(obs.transpose(0, 2, 3, 1))
        return obs

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Every env to a fresh episode; with ``seed`` (env ``j`` gets ``seed + j``, or a list of
        one seed per env) on a pool rebuilt with it. Resets of some envs only (``reset_mask``)
        are not supported: envpool steps all its envs together."""
        if options and options.get("reset_mask") is not None and not np.all(options["reset_mask"]):
            raise ValueError("vectorization='envpool' resets all its envs together (no reset_mask)")
        if seed is not None or self.pool is None:
            self._build(seed)
        obs, info = self.pool.reset()
        self._score[:], self._length[:], self._prev_done[:] = 0.0, 0, False
        return self._frames(obs), info

    def _build(self, seed: int | list[int] | None) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0]) % _SEED_RANGE
        if isinstance(seed, int | np.integer):
            seeds = {"seed": int(seed) % _SEED_RANGE}
        else:  # one per env, as gymnasium's vector envs take them
            if len(seed) != self.num_envs or any(s is None for s in seed):
                raise ValueError(f"reset takes one int seed or {self.num_envs} of them, got {seed!r}")
            seeds = {"env_seed": [int(s) % _SEED_RANGE for s in seed]}
        self.pool = import_envpool().make_gymnasium(self.task, num_envs=self.num_envs, batch_size=self.num_envs,
                                                    **seeds, **self.options)
        with _quiet_spaces():  # the pool builds its own spaces once, when first read
            self.pool.observation_space, self.pool.action_space  # noqa: B018

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self.pool is None:
            raise RuntimeError("reset the envs before stepping them")
        obs, rewards, terminateds, truncateds, info = self.pool.step(np.asarray(actions))
        if self.atari:
            self._count_games(terminateds, truncateds, info)
        return self._frames(obs), rewards, terminateds, truncateds, info

    def _count_games(self, terminateds: np.ndarray, truncateds: np.ndarray, info: dict[str, Any]) -> None:
        """Whole games' raw scores and lengths (agent steps, reset steps left out) into ``info``
        at the step a game ends: game over, or the time limit."""
        played = ~self._prev_done  # not the reset step of next-step autoreset
        self._score += np.where(played, info["reward"], 0.0)
        self._length += played
        self._prev_done = dones = terminateds | truncateds
        over = dones & (truncateds | info["terminated"].astype(bool))
        if over.any():
            info["game_score"], info["_game_score"] = np.where(over, self._score, 0.0), over
            info["game_length"], info["_game_length"] = np.where(over, self._length, 0), over
            self._score[over], self._length[over] = 0.0, 0

    def close_extras(self, **kwargs: Any) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


@contextlib.contextmanager
def _quiet_spaces() -> Iterator[None]:
    """envpool gives float32 Boxes float64 bounds, on which gymnasium warns to no use."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*Box (low|high)'s precision lowered by casting to float32")
        yield


def _spec(task: str, **options: Any) -> Any:
    """envpool's spec of one env of ``task`` (its spaces and options), kept per process: making
    one loads an Atari game's ROM (a quarter of a second)."""
    key = tuple(sorted(options.items()))
    try:
        hash(key)
    except TypeError:  # an unhashable option value
        return import_envpool().make_spec(task, **options)
    return _cached_spec(task, key)


@functools.lru_cache(maxsize=64)
def _cached_spec(task: str, options: tuple) -> Any:
    return import_envpool().make_spec(task, **dict(options))


def fire_action(spec: Any) -> int | None:
    """The index of FIRE in the action set of the Atari game of envpool ``spec``, when envpool
    presses FIRE at its resets (``use_fire_reset``: the game has FIRE); read from the game's ROM
    with ale-py (``None`` without ale-py, or without FIRE)."""
    config = spec.config
    if not getattr(config, "use_fire_reset", False):
        return None
    return _rom_fire_action(os.path.join(config.base_path, "atari", "roms", f"{config.task}.bin"),
                            bool(config.full_action_space))


@functools.lru_cache(maxsize=64)
def _rom_fire_action(rom: str, full_action_space: bool) -> int | None:
    try:
        import ale_py
    except ImportError:
        return None
    if not os.path.isfile(rom):
        return None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.loadROM(rom)
    actions = list(ale.getLegalActionSet() if full_action_space else ale.getMinimalActionSet())
    return actions.index(ale_py.Action.FIRE) if ale_py.Action.FIRE in actions else None


def make_envpool(env_id: str, kwargs: dict[str, Any] | None, num_envs: int) -> EnvPoolVectorEnv:
    """``num_envs`` envs of ``env_id`` (with its ``env_kwargs``) on envpool."""
    task, atari = envpool_task(env_id)
    return EnvPoolVectorEnv(task, num_envs, envpool_options(env_id, task, atari, kwargs or {}), atari)
