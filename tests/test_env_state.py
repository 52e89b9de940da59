"""Env state as plain data: restored envs continue exactly, and loading a state never runs code."""

from __future__ import annotations

import array
import io
import pickle
import random
import threading
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl.data.envs import make_vector_env
from lightning_rl.data.envs.state import UnsupportedEnvState, capture_env_state, restore_env_state

NUM_ENVS = 3


class _Tracker:
    """Points back at its env (a cycle) and shares its log list with it."""

    def __init__(self, owner: gym.Env) -> None:
        self.owner = owner
        self.log: list[list[float]] = []


class Walker(gym.Env):
    """A pure-Python env whose dynamics read every kind of state it holds."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float64)
        self.action_space = gym.spaces.Discrete(3)
        self.py_rng = random.Random(0)
        self.noise = np.random.default_rng(0)
        self.path: list[int] = []
        self.visits: dict[Any, int] = {}
        self.recent: deque[float] = deque(maxlen=4)
        self.tracker = _Tracker(self)
        self.log = self.tracker.log
        self.counts = np.zeros(5, dtype=np.int32)
        self.counts_view = self.counts  # an alias: a restore must keep both names on one array
        self.pos = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.py_rng.seed(seed)
            self.noise = np.random.default_rng(seed + 1)
        self.pos = int(self.np_random.integers(-3, 4))
        self.path = [self.pos]
        self.visits.clear()
        self.recent.clear()
        self.counts[:] = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pos += int(action) - 1 + (self.py_rng.random() < 0.2)
        self.path.append(self.pos)
        key = (self.pos, len(self.path) % 2) if self.pos % 3 else str(self.pos)
        self.visits[key] = self.visits.get(key, 0) + 1
        self.recent.append(float(self.noise.normal()))
        self.log.append([float(self.pos), self.recent[-1]])
        self.counts[self.pos % 5] += 1
        reward = self.visits[key] - abs(self.pos) / 10
        return self._obs(), reward, abs(self.pos) > 6, len(self.path) > 40, {}

    def _obs(self) -> np.ndarray:
        summary = [self.pos, len(self.path), sum(self.recent), len(self.visits), len(self.log), self.counts_view.max()]
        return np.array(summary, np.float64)


# (env, vectorization, steps before the capture, steps after): both phases cross episode ends.
SETUPS = [
    ("CartPole-v1", "vector_entry_point", 300, 300),
    ("CartPole-v1", "sync", 300, 300),
    ("Pendulum-v1", "sync", 300, 300),
    ("Acrobot-v1", "sync", 600, 600),
    ("MountainCarContinuous-v0", "sync", 1100, 1100),
    (Walker, "sync", 300, 300),
]


def through_checkpoint(state: Any) -> Any:
    """What a checkpoint gives back: ``torch.save`` then ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_plain(x: Any, path: str = "state") -> None:
    if type(x) is dict:
        for k, v in x.items():
            assert type(k) is str, f"{path}: key {k!r}"
            assert_plain(v, f"{path}[{k!r}]")
    elif type(x) in (list, tuple):
        for i, v in enumerate(x):
            assert_plain(v, f"{path}[{i}]")
    else:
        assert type(x) in (str, int, float, bool, type(None), torch.Tensor), f"{path}: {type(x).__name__}"


def random_actions(space: gym.Space, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=n)
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)


@pytest.mark.parametrize(
    ("env", "vectorization", "before", "after"), SETUPS, ids=[f"{getattr(e, '__name__', e)}-{v}" for e, v, *_ in SETUPS]
)
def test_restored_envs_continue_exactly(env: Any, vectorization: str, before: int, after: int) -> None:
    a = make_vector_env(env, NUM_ENVS, vectorization)
    b = make_vector_env(env, NUM_ENVS, vectorization)
    try:
        rng = np.random.default_rng(0)
        space = a.single_action_space
        a.reset(seed=10)
        a.action_space.seed(1)
        for _ in range(before):
            obs_a, *_ = a.step(random_actions(space, rng, NUM_ENVS))
        episodes_at_capture = a.episode_count
        state = through_checkpoint(capture_env_state(a))
        assert_plain(state)

        obs_b, _ = b.reset(seed=20)
        b.action_space.seed(2)
        assert not np.array_equal(obs_a, obs_b)  # B really starts elsewhere
        restore_env_state(b, state)

        for t in range(after):
            actions = random_actions(space, rng, NUM_ENVS)
            for name, x, y in zip(("obs", "rewards", "terminateds", "truncateds"), a.step(actions), b.step(actions)):
                np.testing.assert_array_equal(x, y, err_msg=f"{name} differ {t} steps after the restore")
        assert episodes_at_capture > 0 and a.episode_count > episodes_at_capture  # both phases cross episode ends
        assert b.episode_count == a.episode_count
        assert list(b.return_queue) == list(a.return_queue)
        assert list(b.length_queue) == list(a.length_queue)
        for _ in range(20):
            np.testing.assert_array_equal(a.action_space.sample(), b.action_space.sample())
    finally:
        a.close()
        b.close()


def test_shared_objects_and_cycles_stay_shared() -> None:
    a, b = make_vector_env(Walker, 2, "sync"), make_vector_env(Walker, 2, "sync")
    a.reset(seed=0)
    b.reset(seed=1)
    for _ in range(30):
        a.step(np.ones(2, dtype=np.int64))
    restore_env_state(b, through_checkpoint(capture_env_state(a)))
    walker = b.unwrapped.envs[1]
    assert walker.tracker.owner is walker
    assert walker.log is walker.tracker.log and walker.log == a.unwrapped.envs[1].log
    assert walker.counts_view is walker.counts
    assert b.unwrapped.single_action_space is b.unwrapped.envs[0].action_space


@pytest.mark.timeout(60)
def test_async_envs_are_unsupported() -> None:
    envs = make_vector_env("CartPole-v1", 2, "async")
    processes = list(envs.unwrapped.processes)
    try:
        where = r"^envs\.env: gymnasium\.vector\.async_vector_env\.AsyncVectorEnv .*other processes"
        with pytest.raises(UnsupportedEnvState, match=where):
            capture_env_state(envs)
    finally:
        envs.close()
        for process in processes:
            process.join(timeout=10)
        left = [process.pid for process in processes if process.is_alive()]
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    assert left == []


class _HoldsLock(Walker):
    def __init__(self) -> None:
        super().__init__()
        self.guard = threading.Lock()


class _HoldsArray(Walker):
    def __init__(self) -> None:
        super().__init__()
        self.buffers = {"x": [array.array("d", [0.0, 1.0])]}


@pytest.mark.parametrize(
    ("env", "where"), [(_HoldsLock, "envs.env.envs[0].guard: _thread.lock"),
                       (_HoldsArray, "envs.env.envs[0].buffers['x'][0]: array.array")]
)
def test_state_held_in_c_objects_is_unsupported(env: type, where: str) -> None:
    envs = make_vector_env(env, 2, "sync")
    with pytest.raises(UnsupportedEnvState) as err:
        capture_env_state(envs)
    assert str(err.value).startswith(where + " ")


class _NoModuleMeta(type):
    """A metaclass whose classes have no ``__module__``, as SWIG's ``SwigPyObject`` (Box2D) has none."""

    def __getattribute__(cls, name: str) -> Any:
        if name == "__module__":
            raise AttributeError("__module__")
        return super().__getattribute__(name)


class _SwigLike(metaclass=_NoModuleMeta):
    """State held in C, in a type without ``__module__``: no ``__dict__`` to capture."""

    __slots__ = ()


class _PlainNoModule(metaclass=_NoModuleMeta):
    """A plain Python object whose type has no ``__module__``: its attributes are its state."""

    def __init__(self) -> None:
        self.hits = 0


class _RaisingDict:
    """Looking at its attributes raises: an unexpected error while capturing."""

    @property
    def __dict__(self) -> dict:
        raise RuntimeError("attributes unavailable")


class _HoldsSwigLike(Walker):
    def __init__(self) -> None:
        super().__init__()
        self.world = {"body": _SwigLike()}


class _HoldsRaising(Walker):
    def __init__(self) -> None:
        super().__init__()
        self.handle = _RaisingDict()


class _HoldsPlainNoModule(Walker):
    def __init__(self) -> None:
        super().__init__()
        self.counter = _PlainNoModule()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.counter.hits += 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward + self.counter.hits, terminated, truncated, info


def test_a_type_without_module_is_named_without_it() -> None:
    with pytest.raises(AttributeError):
        getattr(_SwigLike, "__module__")  # noqa: B009 (the double really lacks it)
    envs = make_vector_env(_HoldsSwigLike, 2, "sync")
    with pytest.raises(UnsupportedEnvState) as err:
        capture_env_state(envs)
    assert str(err.value) == "envs.env.envs[0].world['body']: _SwigLike is not plain data and has no __dict__"
    envs.close()


def test_any_error_while_capturing_is_unsupported_state_naming_the_path() -> None:
    envs = make_vector_env(_HoldsRaising, 2, "sync")
    with pytest.raises(UnsupportedEnvState, match=r"^envs\.env\.envs\[0\]\.handle: RuntimeError while capturing: "
                                                  "attributes unavailable$"):
        capture_env_state(envs)
    envs.close()


def test_a_plain_object_of_a_type_without_module_is_captured_and_restored() -> None:
    a, b = make_vector_env(_HoldsPlainNoModule, 2, "sync"), make_vector_env(_HoldsPlainNoModule, 2, "sync")
    a.reset(seed=0)
    b.reset(seed=1)
    for _ in range(7):
        a.step(np.ones(2, dtype=np.int64))
    restore_env_state(b, through_checkpoint(capture_env_state(a)))
    assert b.unwrapped.envs[1].counter.hits == 7
    for _ in range(5):
        for x, y in zip(a.step(np.ones(2, dtype=np.int64)), b.step(np.ones(2, dtype=np.int64))):
            np.testing.assert_array_equal(x, y)
    a.close()
    b.close()


class _CreatesFile:
    """Unpickling this creates ``path``: the payload a malicious checkpoint would carry."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


class _Spy:
    """Counts its instances: restoring must never build an object named in the data."""

    made = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> _Spy:
        _Spy.made += 1
        return super().__new__(cls)


def _with_attr(state: dict, name: str, value: Any) -> dict:
    return {**state, "attrs": {**state["attrs"], name: value}}


def test_pickled_payloads_are_never_unpickled(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_CreatesFile(probe)))
    assert probe.exists()  # the payload is live: unpickling it does create a file
    target = tmp_path / "pwned"
    payload = pickle.dumps(_CreatesFile(target))
    envs = make_vector_env("CartPole-v1", 2, "sync")
    envs.reset(seed=0)
    good = capture_env_state(envs)
    crafted = [
        payload,  # what the pickling state_dict stored
        _with_attr(good, "episode_count", payload),
        _with_attr(good, "episode_returns", {"__tag__": "ndarray", "dtype": "<f8", "scalar": False, "data": payload}),
        _with_attr(good, "return_queue", {"__tag__": "deque", "maxlen": None, "items": [payload]}),
        _with_attr(good, "return_queue", {"__tag__": "deque", "maxlen": None, "items": payload}),
    ]
    for state in crafted:
        with pytest.raises((ValueError, TypeError)):
            restore_env_state(envs, through_checkpoint(state))
    assert not target.exists()
    envs.close()


def test_class_names_in_the_data_are_never_instantiated(tmp_path: Path) -> None:
    spy = f"{__name__}._Spy"
    envs = make_vector_env("CartPole-v1", 2, "sync")
    envs.reset(seed=0)
    good = capture_env_state(envs)
    crafted = [
        _with_attr(good, "intruder", {"__tag__": "object", "type": spy, "attrs": {}}),
        _with_attr(good, "_stats_key", {"__tag__": "object", "type": spy, "attrs": {}}),
        _with_attr(good, "_stats_key", {"__tag__": spy}),
        _with_attr(good, "_stats_key", {"__tag__": "enum", "name": spy}),
        _with_attr(good, "_stats_key", {"__tag__": "dtype", "str": spy}),
        _with_attr(good, "_stats_key", {"__tag__": "np_generator", "state": {"bit_generator": spy, "state": {}}}),
        _with_attr(good, "env", {"__tag__": "object", "type": "subprocess.Popen",
                                 "attrs": {"args": ["touch", str(tmp_path / "pwned")]}}),
        {**good, "type": spy},
    ]
    for state in crafted:
        with pytest.raises((ValueError, TypeError)):
            restore_env_state(envs, through_checkpoint(state))
    assert _Spy.made == 0
    assert not (tmp_path / "pwned").exists()
    envs.close()


@pytest.mark.parametrize(
    ("other", "num_envs", "where"),
    [("Pendulum-v1", 2, r"envs\.env\.envs\[0\]\.env\.env\.env: .*CartPoleEnv.*PendulumEnv"),
     ("CartPole-v1", 1, r"envs\.env\.env_fns\[1\]: the fresh env has nothing here")],
)
def test_restoring_into_different_envs_names_the_path(other: str, num_envs: int, where: str) -> None:
    cartpoles, fresh = make_vector_env("CartPole-v1", 2, "sync"), make_vector_env(other, num_envs, "sync")
    cartpoles.reset(seed=0)
    fresh.reset(seed=0)
    with pytest.raises(ValueError, match=where):
        restore_env_state(fresh, through_checkpoint(capture_env_state(cartpoles)))



def _types(state: Any) -> set[str]:
    if isinstance(state, dict):
        found = {state["type"]} if isinstance(state.get("type"), str) else set()
        return found.union(*(_types(v) for v in state.values()))
    if isinstance(state, list | tuple):
        return set().union(*(_types(v) for v in state))
    return set()


def test_the_type_names_a_state_records_keep_their_paths_of_0_1_0() -> None:
    """A state records the class of every object it captures, and restoring compares it with the
    fresh env's: ``EpisodeStatistics`` and ``GymMake`` (in the state of every vector env, and of
    an env given ``env_kwargs``) are named by the path a checkpoint of 0.1.0 holds, wherever in
    ``data/envs/`` they are defined."""
    from lightning_rl.data.envs import GymMake

    envs = make_vector_env(GymMake("CartPole-v1", {"max_episode_steps": 50}), 2, "sync")
    envs.reset(seed=0)
    names = {t for t in _types(capture_env_state(envs)) if t.startswith("lightning_rl.")}
    assert names == {"lightning_rl.data.envs.EpisodeStatistics", "lightning_rl.data.envs.GymMake"}
