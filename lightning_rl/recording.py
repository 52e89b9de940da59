"""Watch a trained agent: greedy episodes rendered into an animated GIF.

``record(model, "agent.gif")`` plays ``num_episodes`` greedy episodes on one env made with
``render_mode="rgb_array"`` and writes its frames as a GIF with Pillow (``pip install
pillow``; classic-control envs such as CartPole and Pendulum render with pygame: ``pip
install pygame-ce``, both in the ``plot`` extra). A multi-agent model plays its PettingZoo
env, each agent acting with the policy ``policy_mapping_fn`` names for it. ``lightning-rl record`` plays
a checkpoint (``loading.load_model``).
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.checkpoint import algorithm_names
from lightning_rl.data.envs import EnvSpec, GymMake, check_env
from lightning_rl.data.envs.spaces import flatten_env
from lightning_rl.evaluation import env_step_limit, episode_step_cap, max_episode_steps_of, say_cut
from lightning_rl.extras import missing_dependency
from lightning_rl.inference import Acting
from lightning_rl.loading import PathLikeStr, load_model

__all__ = ["main", "make_render_env", "make_render_parallel_env", "record"]


# ----------------------------------------------------------------------------- envs
def headless_sdl() -> None:
    """Render off-screen: pygame (classic control's renderer) initialises SDL's video and audio,
    which on a machine without a display or sound server prints errors such as
    "XDG_RUNTIME_DIR is invalid". Frames are drawn to surfaces, so SDL's dummy drivers serve;
    a driver the user chose is kept. SDL also installs, where none is set, a SIGTERM handler that
    turns the signal into a quit event no one reads (``kill PID`` would be ignored while
    recording): ``SDL_NO_SIGNAL_HANDLERS`` keeps it out."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_NO_SIGNAL_HANDLERS", "1")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


OFFSCREEN_GL = ("egl", "osmesa")  # MuJoCo's headless OpenGL backends, in the order tried


def offscreen_gl_works(backend: str) -> bool:
    """Whether MuJoCo can make an OpenGL context with ``backend`` (``MUJOCO_GL``), tried in a child
    process: PyOpenGL binds its platform once per process, so a failed try would spoil the next."""
    probe = f"from mujoco.{backend} import GLContext; c = GLContext(16, 16); c.make_current(); c.free()"
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def mujoco_offscreen(env: gym.Env, name: Any) -> None:
    """A MuJoCo env renders through OpenGL. Without a display, and with ``MUJOCO_GL`` unset,
    gymnasium tries GLFW first, which fails and leaves the other backends unusable in the process:
    here the first of EGL and OSMesa that makes a context is chosen before the first frame, and
    neither is one line saying so. A ``MUJOCO_GL`` the user set, or a display, is kept."""
    if "MUJOCO_GL" in os.environ or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    mujoco_env = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")
    if mujoco_env is None or not isinstance(env.unwrapped, mujoco_env.MujocoEnv):
        return
    for backend in OFFSCREEN_GL:
        if offscreen_gl_works(backend):
            os.environ["MUJOCO_GL"] = backend
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return
    env.close()
    raise gym.error.DependencyNotInstalled(
        f"env {name!r} renders with OpenGL, and without a display neither MUJOCO_GL=egl nor MUJOCO_GL=osmesa "
        "made a context here: install EGL (libegl1) or OSMesa (libosmesa6), or record where a display is")


def make_render_env(env: EnvSpec) -> gym.Env:
    """One env that renders ``rgb_array`` frames, from a registered id or a zero-argument callable.

    An id (or a ``GymMake``: an id with ``env_kwargs``) is made with ``gymnasium.make(id,
    **env_kwargs, render_mode="rgb_array")``; a callable must itself return an env whose
    ``render_mode`` is ``"rgb_array"`` (e.g. ``lambda: gym.make("CartPole-v1",
    render_mode="rgb_array")``), else ``ValueError``.
    """
    headless_sdl()
    if isinstance(env, str | GymMake):
        make = GymMake(env) if isinstance(env, str) else env
        check_env(make.env_id)
        with warnings.catch_warnings():  # gymnasium only warns on an unsupported render mode
            warnings.simplefilter("ignore")
            made = make(render_mode="rgb_array")
        modes = list(made.metadata.get("render_modes") or [])
        if "rgb_array" not in modes:
            made.close()
            raise ValueError(f"env {env!r} cannot render rgb_array frames (its render modes: {modes})")
        mujoco_offscreen(made, make.env_id)
        return made
    if callable(env):
        made = env()
        if not isinstance(made, gym.Env):
            raise TypeError(f"env factory {env!r} returned {type(made).__name__}, not a gymnasium.Env")
        if made.render_mode != "rgb_array":
            mode = made.render_mode
            made.close()
            raise ValueError(
                f"recording needs frames, but env factory {env!r} made an env with render_mode={mode!r}; "
                "make it with render_mode='rgb_array', e.g. lambda: gym.make(ID, render_mode='rgb_array')"
            )
        mujoco_offscreen(made, env)
        return made
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def make_render_parallel_env(env: Callable[..., Any]) -> Any:
    """One PettingZoo parallel env that renders ``rgb_array`` frames, from the factory a
    multi-agent model trained on: called with ``render_mode="rgb_array"`` when it takes that
    argument (PettingZoo's own envs do: ``mpe2.simple_spread_v3.parallel_env``), else as it is,
    and then the env it makes must render ``rgb_array`` frames itself; else ``ValueError``."""
    from lightning_rl.data.multi_agent import make_parallel_env

    headless_sdl()
    factory = partial(env, render_mode="rgb_array") if _takes_render_mode(env) else env
    with warnings.catch_warnings():  # PettingZoo only warns on an unsupported render mode
        warnings.simplefilter("ignore")
        made = make_parallel_env(factory)
    mode = getattr(made, "render_mode", None)
    if mode != "rgb_array":
        made.close()
        raise ValueError(
            f"recording needs frames, but the multi-agent env {env!r} made an env with render_mode={mode!r} "
            "(its render modes: "
            f"{list((getattr(made, 'metadata', None) or {}).get('render_modes') or [])}); give the model a "
            "factory that makes it with render_mode='rgb_array'"
        )
    return made


def _takes_render_mode(env: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(env).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as it is
        return False
    return any(p.name == "render_mode" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


# ----------------------------------------------------------------------------- recording
def _frame(env: gym.Env) -> np.ndarray:
    frame = env.render()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] not in (3, 4):
        raise ValueError(
            f"{env} rendered {type(frame).__name__} "
            f"{getattr(frame, 'shape', '')}, not an RGB frame [height, width, 3]"
        )
    return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)


def _save_gif(frames: list[np.ndarray], out: Path, fps: float) -> None:
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "writing GIFs needs Pillow: pip install pillow (or pip install 'lightning-rl[plot]')"
        ) from err
    images = [Image.fromarray(f) for f in frames]
    out.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(
        out, format="GIF", save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0
    )


@torch.no_grad()
def record(
    model: Algorithm,
    out: PathLikeStr,
    num_episodes: int = 3,
    env: EnvSpec | None = None,
    seed: int | None = None,
    fps: float = 30,
    max_frames: int = 2000,
    policy_id: str | None = None,
) -> list[float]:
    """Play ``num_episodes`` greedy episodes and write their frames to the animated GIF ``out``.

    ``env`` defaults to the model's own (``model.env_spec``); see :func:`make_render_env`.
    ``seed`` seeds the first reset (the later episodes follow from it). Actions are
    ``model.compute_actions(obs[None], explore=False)[0]``, clipped to the bounds of a
    ``Box`` action space. The GIF holds at most ``max_frames`` frames (the reset frame of
    each episode and one per step): once that many were taken recording stops, with a
    warning, and the unfinished episode is left out of the returns. Each episode is capped as
    evaluation's are: at the env's own time limit where it declares one, else at the model's
    ``evaluation_max_episode_steps`` steps; an episode cut there ends with its return so far, and
    a warning names the env (once). Returns the returns of the episodes played to the end.

    A multi-agent model plays its PettingZoo env (see :func:`make_render_parallel_env`), every
    live agent acting greedily with the policy ``policy_mapping_fn`` names for it (``policy_id``
    must be ``None``); the returns are the team's, summed over agents, as training logs them.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if max_frames < 2:
        raise ValueError(f"max_frames must be >= 2, got {max_frames}")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    spec = env if env is not None else model.env_spec
    if getattr(model, "multi_agent", False):
        if policy_id is not None:
            raise ValueError(f"policy_id={policy_id!r}: in a multi-agent env each agent acts with the policy "
                             "policy_mapping_fn names for it")
        tape = _play_multi_agent(model, spec, num_episodes, seed, max_frames)
    else:
        tape = _play(model, spec, num_episodes, seed, max_frames, policy_id)
    tape.finish(spec, num_episodes, Path(out), fps)
    return tape.returns


class _Tape:
    """A recording's frames and returns, and why its episodes stopped early: the GIF full at
    ``max_frames`` (recording ends) or an episode cut at ``cap`` steps (its return counted)."""

    def __init__(self, max_frames: int, cap: int, own_cap: bool) -> None:
        self.frames: list[np.ndarray] = []
        self.returns: list[float] = []
        self.max_frames, self.cap, self.own_cap, self.cut, self.full = max_frames, cap, own_cap, 0, False

    def stop(self, steps: int) -> bool:
        """Whether the episode playing stops here, ``steps`` steps in."""
        self.full = len(self.frames) >= self.max_frames
        capped = not self.full and steps >= self.cap
        self.cut += capped
        return self.full or capped

    def end(self, episode_return: float) -> bool:
        """Count a finished episode's return; ``True`` when the GIF is full (recording ends)."""
        if not self.full:
            self.returns.append(episode_return)
        return self.full

    def finish(self, spec: Any, num_episodes: int, out: Path, fps: float) -> None:
        if self.cut:
            say_cut(spec, self.cap, self.own_cap, self.cut, num_episodes, what="record")
        if self.full:
            warnings.warn(f"stopped recording at max_frames={self.max_frames} after {len(self.returns)} of "
                          f"{num_episodes} episodes", stacklevel=3)
        _save_gif(self.frames, out, fps)


def _play(model: Algorithm, spec: EnvSpec, num_episodes: int, seed: int | None, max_frames: int,
          policy_id: str | None) -> _Tape:
    """Greedy episodes of one gymnasium env (an Atari episode is a whole game, its raw score)."""
    policy_kwargs = {} if policy_id is None else {"policy_id": policy_id}
    render_env = flatten_env(make_render_env(spec))  # Dict/Tuple observations as the module sees them
    try:
        model.check_spaces(render_env.observation_space, render_env.action_space)
        space = render_env.action_space
        games = bool(render_env.metadata.get("game_scores"))  # episodes are whole games
        tape = _Tape(max_frames, *episode_step_cap(env_step_limit(render_env), max_episode_steps_of(model)))
        for episode in range(num_episodes):
            obs, _ = render_env.reset(seed=seed if episode == 0 else None)
            tape.frames.append(_frame(render_env))
            episode_return, done, steps = 0.0, False, 0
            acting = Acting(model, **policy_kwargs)  # a recurrent policy's state starts fresh
            while not done and not tape.stop(steps):
                steps += 1
                action = _in_bounds(acting.act(np.asarray(obs)[None])[0], space)
                obs, reward, terminated, truncated, info = render_env.step(action)
                episode_return += float(reward)
                done = bool(terminated or truncated)
                acting.observe([reward], [done])
                tape.frames.append(_frame(render_env))
                if games and done:  # Atari (data/envs/atari.py): a whole game, its raw score
                    episode_return = float(info.get("game_score", episode_return))
                    if "game_score" not in info:  # a lost life: the game goes on
                        obs, _ = render_env.reset()
                        done = False
            if tape.end(episode_return):
                break
    finally:
        render_env.close()
    return tape


def _play_multi_agent(model: Algorithm, spec: Any, num_episodes: int, seed: int | None, max_frames: int) -> _Tape:
    """Greedy episodes of a PettingZoo env, every live agent acting with its mapped policy; the
    returns are the team's (summed over agents), as evaluation and training log them."""
    made = make_render_parallel_env(spec)
    try:
        for agent in made.possible_agents:
            policy_id = model.policy_mapping_fn(agent)
            spaces = (made.observation_space(agent), made.action_space(agent))
            if spaces != model.policy_spaces[policy_id]:
                raise ValueError(f"agent {agent!r} of env {spec!r} has spaces {spaces[0]}, {spaces[1]}, but its "
                                 f"policy {policy_id!r} was built for {model.policy_spaces[policy_id][0]}, "
                                 f"{model.policy_spaces[policy_id][1]}")
        tape = _Tape(max_frames, max_episode_steps_of(model), own_cap=False)
        for episode in range(num_episodes):
            obs, _ = made.reset(seed=seed if episode == 0 else None)
            tape.frames.append(_frame(made))
            total, steps = 0.0, 0
            while made.agents and not tape.stop(steps):
                steps += 1
                actions = {}
                for agent in made.agents:
                    action = model.compute_actions(np.asarray(obs[agent]), policy_id=model.policy_mapping_fn(agent),
                                                   explore=False)
                    action = _in_bounds(action, made.action_space(agent))
                    actions[agent] = action.item() if np.ndim(action) == 0 else action
                obs, rewards, _, _, _ = made.step(actions)
                total += float(sum(rewards.values()))
                tape.frames.append(_frame(made))
            if tape.end(total):
                break
    finally:
        made.close()
    return tape


def _in_bounds(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """``action`` clipped to a ``Box`` space's bounds, in its dtype (any other space's as it is)."""
    return np.clip(action, space.low, space.high).astype(space.dtype) if isinstance(space, gym.spaces.Box) else action


# ----------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``record`` subcommand's arguments (for wiring into a CLI's subparsers)."""
    parser.add_argument("--ckpt_path", "--ckpt-path", dest="ckpt_path", required=True,
                        help="Lightning checkpoint of a lightning_rl algorithm")
    parser.add_argument("--out", default="agent.gif", help="GIF to write (default: agent.gif)")
    parser.add_argument("--algo", default=None,
                        help=f"algorithm class ({', '.join(algorithm_names())}); default: the checkpoint's")
    parser.add_argument("--num-episodes", "--num_episodes", dest="num_episodes", type=int, default=3,
                        help="greedy episodes to play (default: 3)")
    parser.add_argument("--env", default=None, help="registered env id to play on (default: the model's env; "
                        "the model's env_kwargs still apply unless --env_kwargs is given)")
    parser.add_argument("--env_kwargs", "--env-kwargs", dest="env_kwargs", type=_kwargs, default=None,
                        help="env keyword arguments as YAML, e.g. '{size: 5}' (default: the model's env_kwargs)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the first reset")
    parser.add_argument("--fps", type=float, default=30, help="GIF frames per second (default: 30)")
    parser.add_argument("--max-frames", "--max_frames", dest="max_frames", type=int, default=2000,
                        help="at most this many frames in the GIF (default: 2000)")
    return parser


def _kwargs(text: str) -> dict[str, Any]:
    """``--env_kwargs '{size: 5}'``: a YAML (or JSON) mapping."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"not YAML: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{size: 5}}', got {text!r}")
    return value


def run_from_args(args: argparse.Namespace) -> int:
    """Run the parsed ``record`` arguments; prints where the GIF was written. Returns an exit code."""
    try:
        overrides = {k: v for k, v in (("env", args.env), ("env_kwargs", args.env_kwargs)) if v is not None}
        model = load_model(args.ckpt_path, algo=args.algo, **overrides)
        # the model's own env: the checkpoint's env and env_kwargs, or the overrides
        returns = record(model, args.out, num_episodes=args.num_episodes, seed=args.seed,
                         fps=args.fps, max_frames=args.max_frames)
    except (FileNotFoundError, ValueError, TypeError, ImportError, gym.error.Error) as err:
        # gym.error.DependencyNotInstalled: e.g. pygame, which classic-control envs render with; named
        # as this package's extra (gymnasium's message says to install plain pygame, which clashes)
        print(f"lightning-rl record: error: {missing_dependency(err) or err}", file=sys.stderr)
        return 1
    shown = ", ".join(f"{r:.1f}" for r in returns) or "none finished"
    print(f"wrote {args.out} ({type(model).__name__}, episode returns: {shown})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``lightning-rl record --ckpt_path ... --out agent.gif [--algo PPO] [--num-episodes N]``.

    ``argv`` comes without the ``record`` word; returns the exit code.
    """
    parser = add_arguments(argparse.ArgumentParser(prog="lightning-rl record", description=__doc__.split("\n")[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

