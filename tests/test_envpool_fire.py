"""Greedy evaluation on envpool's Atari games ends with whole games: a no-op step then FIRE
starts every episode and life, as on the gymnasium path, so a policy that never fires does
not wait out the time limit (issue 35, item 8). A few hundred Breakout steps."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("envpool")
pytest.importorskip("ale_py")

from lightning_rl import PPO, evaluate
from lightning_rl.data.envs import GymMake, make_vector_env
from lightning_rl.data.samplers.engine import EnvSampler

LIMIT_STEPS = 1000  # the games' time limit here (4,000 frames): the old evaluation waited it out


def test_envpool_names_the_fire_action_of_games_that_have_one():
    for env_id, fire in (("ALE/Breakout-v5", 1), ("ALE/Freeway-v5", None)):  # Freeway: NOOP, UP, DOWN
        envs = make_vector_env(env_id, 1, "envpool")
        try:
            assert envs.metadata.get("fire_after_reset") == fire
            assert envs.unwrapped.max_episode_steps == 27_000  # ALE v5's 108,000 frames
        finally:
            envs.close()


@pytest.mark.timeout(180)
def test_greedy_evaluation_on_envpool_breakout_ends_with_whole_games(monkeypatch):
    env = GymMake("ALE/Breakout-v5", {"max_num_frames_per_episode": 4 * LIMIT_STEPS})
    model = PPO(env="ALE/Breakout-v5", env_kwargs=env.kwargs, vectorization="envpool", encoder="nature_cnn",
                hiddens=[], seed=0)
    model.compute_actions = lambda obs, **kwargs: np.zeros(len(obs), dtype=np.int64)  # greedy, never FIRE
    steps = []
    step = EnvSampler.step
    monkeypatch.setattr(EnvSampler, "step", lambda self, actions: steps.append(actions) or step(self, actions))
    returns = evaluate(model, num_episodes=8, seed=1, vectorization="envpool")
    assert len(returns) == 8
    # 5 lives lost by a paddle that does not move take about 125 steps; a life whose ball is never
    # launched (envpool's one FIRE frame lost to a sticky action) would run to the time limit
    assert len(steps) < 300, len(steps)
    first = np.stack(steps[:2])
    assert (first[0] == 0).all() and (first[1] == 1).all()  # a no-op step, then FIRE
