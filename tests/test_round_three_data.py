"""Issue 35, round three, on the data side: a resumed replay survives envs whose state cannot be
saved; check_finite reaches PettingZoo envs; sampler worker processes may own async envs; A3C's
gradients in train mode; and the review's suspicions settled (Ray's lost objects, seeds of DDP
ranks, a game ending on ``LifeLossEnds``' no-op step)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from lightning_rl import DQN
from tests.ray_worker import descendants
from tests.test_env_faults import live_pids

pytestmark = pytest.mark.timeout(120)


def started(model):
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    return dm


# ------------------------------------------------------------------ 3: replay kept when the envs restart
@pytest.mark.parametrize("vectorization", ["async", "envpool"])
def test_a_replay_is_restored_before_envs_without_state_restart(vectorization):
    """Async envs and envpool keep no state a checkpoint can hold: the buffer and its env step
    count come back all the same, the episodes in progress are cut (no n-step window joins the
    old stream to the new), and the warning says what was restored."""
    if vectorization == "envpool":
        pytest.importorskip("envpool")
    kwargs = dict(env="CartPole-v1", vectorization=vectorization, num_envs=2, seed=0, learning_starts=16,
                  train_freq=8, buffer_size=500, n_step=3, hiddens=(8,), total_env_steps=None)
    before = set(descendants(os.getpid()))
    dm = started(DQN(**kwargs))
    try:
        for _ in range(4):
            dm.sample()
        state = dm.state_dict()
        saved = {k: np.array(v) for k, v in dm.buffer.state_dict().items() if isinstance(v, np.ndarray)}
    finally:
        dm.close()
    assert "unsupported" in state["ranks"][0]["envs"] and dm.buffer.num_added == 32
    dm = started(DQN(**kwargs))
    try:
        with pytest.warns(UserWarning, match=r"holds no env state of 'CartPole-v1' \(.*\): the envs were reset .*"
                                             r"restored: the weights, optimizer and counters, the replay buffer "
                                             r"\(64 env steps\) and its env step count \(64\)$"):
            dm.load_state_dict(state)
        assert (dm.buffer.num_added, dm.env_steps, dm.ready) == (32, 64, True)
        restored = dm.buffer.state_dict()
        for key in ("obs", "actions", "rewards"):
            assert np.array_equal(restored[key], saved[key]), key
        last = 31 % dm.buffer.rows  # cut there: the step before it ends its episode, as a truncation
        assert (restored["terminateds"][last - 1] | restored["truncateds"][last - 1]).all()
        assert not restored["valid"][last].any()
        dm.sample()  # and the stream goes on from fresh episodes
        assert dm.env_steps == 80 and dm.buffer.num_added == 40
    finally:
        dm.close()
    assert not live_pids(sorted(set(descendants(os.getpid())) - before), grace_s=10.0)


# ------------------------------------------------------------------ 4: check_finite for PettingZoo envs
def _nan_relay():
    from tests.multi_agent_envs import Relay

    class NaNRelay(Relay):
        """The helper's reward at step 3 of the second episode is NaN; the runner's observation
        at step 2 of the first is infinite when ``bad_obs``."""

        bad_obs = False

        def step(self, actions):
            obs, rewards, terminations, truncations, infos = super().step(actions)
            if self.bad_obs and self.t == 2 and self.episode == 0:
                obs["runner"] = np.array([np.inf, 0, 0], np.float32)
            elif not self.bad_obs and self.t == 3 and self.episode == 1 and "helper" in rewards:
                rewards["helper"] = float("nan")
            return obs, rewards, terminations, truncations, infos

    return NaNRelay


def _multi_agent(algo: str, env, **extra):
    from lightning_rl import IMPALA, PPO
    from tests.multi_agent_envs import by_agent

    common = dict(env=env, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2, seed=0,
                  hiddens=(8,), total_env_steps=None, **extra)
    if algo == "ppo":
        return PPO(**common, rollout_fragment_length=12, sgd_minibatch_size=8)
    if algo == "dqn":
        return DQN(**common, learning_starts=0, train_freq=12, buffer_size=100)
    return IMPALA(**common, num_workers=0, rollout_fragment_length=12, train_batch_size=24)


@pytest.mark.parametrize("algo", ["ppo", "dqn", "impala"])
def test_a_non_finite_reward_of_a_pettingzoo_agent_is_named_by_env_agent_and_step(algo):
    pytest.importorskip("pettingzoo")
    env = _nan_relay()
    step = 10 if algo == "impala" else 9  # (IMPALA's envs spend a step on each reset: next-step autoreset)
    dm = started(_multi_agent(algo, env))
    try:
        with pytest.raises(ValueError, match=rf"^env 0 of 2 \(.*NaNRelay.*\) gave agent 'helper' a non-finite reward "
                                             rf"at its env step {step}: nan\. Fix the env, or pass check_finite=False"):
            dm.sample()
    finally:
        dm.close()
    dm = started(_multi_agent(algo, env, check_finite=False))  # then nothing looks
    try:
        dm.sample()
    finally:
        dm.close()


def test_a_non_finite_observation_of_a_pettingzoo_agent_is_named_too():
    pytest.importorskip("pettingzoo")
    env = _nan_relay()
    env.bad_obs = True
    dm = started(_multi_agent("ppo", env))
    try:
        with pytest.raises(ValueError, match=r"^env 0 of 2 .* gave agent 'runner' a non-finite observation at its "
                                             r"env step 2: array\(\[inf,"):
            dm.sample()
    finally:
        dm.close()


# ------------------------------------------------------------------ 5: sampler worker processes own async envs
@pytest.mark.parametrize("algo", ["impala", "a3c"])
def test_sampler_worker_processes_may_step_async_envs_and_leave_no_process(algo):
    """Each worker process starts its envs' processes (``vectorization="async"``) and stops them:
    after ``close`` none of the workers' processes or their envs' is alive."""
    from lightning_rl import A3C, IMPALA

    kwargs = dict(env="CartPole-v1", vectorization="async", num_workers=2, num_envs=2, rollout_fragment_length=8,
                  hiddens=(8,), seed=0, sampler_timeout_s=60.0, total_env_steps=None)
    model = IMPALA(**kwargs, train_batch_size=32) if algo == "impala" else A3C(**kwargs)
    before = set(descendants(os.getpid()))
    dm = started(model)
    try:
        sent: set[int] = set()
        for _ in range(50):  # until both workers sent what they sampled
            batch = dm.sample()
            assert batch.env_steps == 16 * (2 if algo == "impala" else len(batch.info["workers"]))
            perf = batch.info["perf"]
            sent |= set(batch.info["workers"]) if algo == "a3c" else {
                i for i in range(2) if perf[f"worker_{i}_env_steps_per_s"] > 0}
            if sent == {0, 1}:
                break
        assert sent == {0, 1}
        workers = [p.pid for p in dm.pool.processes]
        grandchildren = [pid for w in workers for pid in descendants(w)]
        assert len(grandchildren) == 4  # two env processes per worker
    finally:
        dm.close()
    assert not live_pids(workers + grandchildren, grace_s=10.0)
    assert not live_pids(sorted(set(descendants(os.getpid())) - before), grace_s=10.0)


# ------------------------------------------------------------------ 6: A3C's gradients in train mode
def test_a3c_gradients_are_computed_in_train_mode_and_the_policy_keeps_acting_in_eval_mode():
    """A worker's copy acts in eval mode; its gradient's forward runs in train mode (Dropout on,
    BatchNorm on the batch), the bootstrap value in eval mode as sampled, and the copy is back in
    eval mode after, with the buffers it had. The same task runs in the learner process with ``num_workers=0``."""
    import gymnasium as gym

    from lightning_rl.data.async_gradients import GradientTask
    from lightning_rl.nn.models import ActorCritic
    from tests.test_acting_mode import ModeProbe

    torch.manual_seed(0)
    policy = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hiddens=(8,))
    probe = ModeProbe(4, [False])
    policy.pi_encoder.insert(0, probe)
    policy.eval()
    T, N = 5, 3
    rollout = {"obs": torch.randn(T, N, 4), "actions": torch.randint(0, 2, (T, N)), "rewards": torch.ones(T, N),
               "terminateds": torch.zeros(T, N, dtype=torch.bool), "truncateds": torch.zeros(T, N, dtype=torch.bool),
               "vf_preds": torch.zeros(T, N)}
    task = GradientTask(gamma=0.99, lambda_=1.0, vf_loss_coeff=0.5, entropy_coeff=0.01)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    flat, _ = task.gradient(policy, rollout, torch.ones(T, N, dtype=torch.bool), torch.randn(N, 4))
    modes = [(grad, training) for _, grad, training, _ in probe.calls]
    assert (True, True) in modes and (True, False) not in modes  # every gradient forward in train mode
    assert not policy.training and not any(m.training for m in policy.modules())  # given back
    # the train-mode forward moved BatchNorm's running statistics; only the gradient travels, so the
    # copy keeps the ones the learner broadcast
    for name, value in policy.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0, msg=name)
    assert torch.isfinite(flat).all() and flat.abs().sum() > 0


# ------------------------------------------------------------------ 7: env seeds of DDP ranks
def _env_seeds(dm, rank: int, world_size: int, restarts: int) -> list[int]:
    from types import SimpleNamespace

    dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
    dm.rank = rank
    firsts = [dm._worker_seed(i, k) for k in range(restarts + 1) for i in range(dm.num_workers)]
    return [s + j for s in firsts for j in range(dm.num_envs)]


@pytest.mark.parametrize(("num_workers", "num_envs"), [(2, 4), (300, 4), (3, 600)])
def test_env_seeds_never_collide_across_ddp_ranks_whatever_the_workers_envs_and_restarts(num_workers, num_envs):
    """Every env of every sampler worker of every rank, restarted workers' too, has its own seed;
    while a rank seeds at most 1000 envs they are ``seed + 1000 * rank + i * num_envs + j`` as before."""
    from lightning_rl import IMPALA

    model = IMPALA(env="CartPole-v1", num_workers=num_workers, num_envs=num_envs, seed=7, hiddens=(8,),
                   total_env_steps=None)
    dm = model.default_datamodule
    dm.connect(model)
    seeds = [_env_seeds(dm, rank, 3, restarts=2) for rank in range(3)]
    everything = [s for rank in seeds for s in rank]
    assert len(set(everything)) == len(everything) == 3 * 3 * num_workers * num_envs
    if num_workers * num_envs <= 1000:
        for rank in range(3):
            assert seeds[rank][: num_workers * num_envs] == [7 + 1000 * rank + n for n in range(num_workers * num_envs)]
    model.counters["num_env_steps_sampled"] = 4096  # resumed: every seed moves on alike
    assert [s - 4096 for s in _env_seeds(dm, 1, 3, restarts=2)] == seeds[1]


def test_rank_seeds_leave_room_for_more_than_1000_envs_per_rank():
    from lightning_rl.data.samplers.engine import rank_seed

    assert [rank_seed(7, r) for r in range(3)] == [7, 1007, 2007]  # unchanged up to 1000 envs
    assert [rank_seed(7, r, 1000) for r in range(3)] == [7, 1007, 2007]
    assert [rank_seed(7, r, 1500) for r in range(3)] == [7, 2007, 4007]  # envs 0..1499 of each rank apart
    assert rank_seed(None, 1, 1500) is None


def test_a_rank_with_more_than_1000_envs_seeds_them_apart_from_the_next_rank(monkeypatch):
    from types import SimpleNamespace

    from lightning_rl import PPO

    model = PPO(env="CartPole-v1", num_envs=1001, rollout_fragment_length=2, seed=7, hiddens=(8,),
                total_env_steps=None)
    dm = model.default_datamodule
    seeds = []
    reset = dm.sampler.reset
    monkeypatch.setattr(dm.sampler, "reset", lambda seed: (seeds.append(seed), reset(seed)))
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2, lightning_module=model)
    dm.setup("fit")
    try:
        assert seeds == [7 + 2000]  # rank 0's envs take seeds 7..1007
    finally:
        dm.close()


# ------------------------------------------------------------------ 7: a game that ends on LifeLossEnds' no-op
def _ends_on_the_noop():
    from tests.test_atari import ScriptedGame

    class EndsOnTheNoop(ScriptedGame):
        """Two lives, lost at steps 4 and 5: the game ends on the no-op that follows the first loss."""

        def reset(self, **kwargs):
            obs, info = super().reset(**kwargs)
            self.lives = 2
            return obs, info

        def step(self, action):
            self.t += 1
            self.lives -= self.t in (4, 5)
            return np.full(2, self.t, np.uint8), 5.0, self.lives == 0, False, {}

    from lightning_rl.data.envs.atari import GameScore, LifeLossEnds

    return LifeLossEnds(GameScore(EndsOnTheNoop()))


def test_a_game_that_ends_on_the_no_op_after_a_lost_life_keeps_its_score():
    from lightning_rl.data.envs import make_vector_env

    env = _ends_on_the_noop()
    env.reset(seed=0)
    assert [env.step(0)[2] for _ in range(4)] == [False, False, False, True]  # a life lost
    _, info = env.reset()  # the no-op ends the game: a real reset, the game's score in its info
    assert env.unwrapped.resets == 2 and (info["game_score"], info["game_length"]) == (25.0, 5)
    venv = make_vector_env(_ends_on_the_noop, 1, "sync")
    venv.reset(seed=0)
    for _ in range(10):  # two games: four steps, then the autoreset step whose no-op ends the game
        venv.step(np.zeros(1, np.int64))
    assert list(venv.return_queue) == [25.0, 25.0] and list(venv.length_queue) == [5, 5]
    venv.close()


# ------------------------------------------------------------------ 7: the first stack after a lost life, per backend
def test_after_a_lost_life_gymnasium_pads_the_first_stack_and_envpool_runs_its_stack_on():
    """A documented backend difference (docs/guides/pixels.md): on the gymnasium path the
    episode that follows a lost life starts with its first frame repeated, as every episode
    does; envpool's stack still holds frames of the life before."""
    pytest.importorskip("ale_py")
    pytest.importorskip("envpool")
    from lightning_rl.data.envs import make_vector_env

    padded = {}
    for vectorization in ("sync", "envpool"):
        envs = make_vector_env("ALE/Breakout-v5", 1, vectorization)
        try:
            envs.reset(seed=0)
            rng = np.random.default_rng(0)
            for _ in range(2000):
                _, _, terminated, truncated, _ = envs.step(rng.integers(0, envs.single_action_space.n, 1))
                if terminated[0] or truncated[0]:
                    break
            assert terminated[0] and not truncated[0]  # a lost life
            obs, *_ = envs.step(np.zeros(1, np.int64))  # the reset row: the next episode's first stack
            padded[vectorization] = all(np.array_equal(obs[0][0], frame) for frame in obs[0][1:])
        finally:
            envs.close()
    assert padded == {"sync": True, "envpool": False}


def _fire_reset(game):
    from lightning_rl.data.envs.atari import FireReset, GameScore, LifeLossEnds

    return FireReset(LifeLossEnds(GameScore(game)))


def test_fire_reset_keeps_the_score_of_a_game_that_ended_in_the_reset_it_wraps():
    """FireReset around LifeLossEnds (make_atari's order): a game that ends on the no-op after
    a lost life is reported in the reset's info, which FireReset gives on (it returned the FIRE
    step's info instead, and the game was never counted)."""
    from lightning_rl.data.envs import make_vector_env

    env = _fire_reset(_ends_on_the_noop().env.env)
    env.reset(seed=0)  # FIRE is step 1
    assert [env.step(0)[2] for _ in range(3)] == [False, False, True]  # steps 2-4: a life lost at 4
    _, info = env.reset()  # the no-op (step 5) ends the game: a real reset, then FIRE
    assert (info["game_score"], info["game_length"]) == (25.0, 5)
    venv = make_vector_env(lambda: _fire_reset(_ends_on_the_noop().env.env), 1, "sync")
    venv.reset(seed=0)
    for _ in range(8):  # two games: three steps after FIRE, then the autoreset step whose no-op ends the game
        venv.step(np.zeros(1, np.int64))
    assert list(venv.return_queue) == [25.0, 25.0] and list(venv.length_queue) == [5, 5]
    venv.close()


def test_fire_reset_keeps_the_score_of_a_game_that_ended_on_the_fire():
    """A game whose last life is lost on the FIRE after a reset is reset again; its score
    comes with that reset's info."""
    from tests.test_atari import ScriptedGame

    class LastLifeOnFire(ScriptedGame):
        """One life, lost at step 3 of the first game and at step 1 (the FIRE) of the second."""

        def __init__(self):
            super().__init__()
            self.ends = iter([3, 1, 100])

        def reset(self, **kwargs):
            obs, info = super().reset(**kwargs)
            self.lives, self.end = 1, next(self.ends)
            return obs, info

        def step(self, action):
            self.t += 1
            self.lives -= self.t == self.end
            return np.full(2, self.t, np.uint8), 5.0, self.lives == 0, False, {}

    env = _fire_reset(LastLifeOnFire())
    env.reset(seed=0)  # FIRE is step 1
    assert env.step(0)[2] is False
    _, _, terminated, _, info = env.step(0)  # step 3: the game ends on a step of the agent's
    assert terminated and (info["game_score"], info["game_length"]) == (15.0, 3)
    _, info = env.reset()  # the second game ends on its FIRE: reset again
    assert env.unwrapped.resets == 3 and (info["game_score"], info["game_length"]) == (5.0, 1)
