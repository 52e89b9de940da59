"""Structured spaces: Dict/Tuple observations (flattened at the envs), MultiDiscrete and
MultiBinary actions (PPO, A2C), and the errors for what cannot be encoded."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import A2C, DQN, IMPALA, PPO, SAC
from lightning_rl.data.envs import make_vector_env
from lightning_rl.data.envs.spaces import flatten_observation, flatten_observation_space
from lightning_rl.evaluation import evaluate
from lightning_rl.nn.distributions import Bernoulli, MultiCategorical
from lightning_rl.nn.models import ActorCritic
from tests.conftest import fit_in_halves, quiet_trainer
from tests.space_envs import CueMatch, binary_cue_match

S = gym.spaces


def nested_space(seed: int) -> gym.Space:
    return S.Dict({
        "image": S.Box(0, 255, (3, 4, 2), np.uint8),
        "d": S.Discrete(4, start=-1),
        "md": S.MultiDiscrete([3, 2, 5], start=[1, 0, -2]),
        "mb": S.MultiBinary(3),
        "t": S.Tuple((S.Discrete(2), S.Box(-1.0, 2.0, (2,), np.float32), S.Dict({"x": S.Discrete(3)}))),
    }, seed=seed)


# ----------------------------------------------------------------------------- flattening
def test_flattening_equals_gymnasiums_flatten_on_samples():
    space = nested_space(0)
    flat = flatten_observation_space(space)
    assert flat.dtype == np.float32 and flat.shape == (24 + 4 + 10 + 3 + 2 + 2 + 3,)
    samples = [space.sample() for _ in range(20)]
    for obs in samples:
        ours = flatten_observation(obs, space)
        np.testing.assert_array_equal(ours, S.flatten(space, obs).astype(np.float32))
        assert flat.contains(ours)
    # a vector env's batch (the same structure, arrays with a leading [N]) flattens row by row
    batch = gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, 20))
    np.testing.assert_array_equal(flatten_observation(batch, space), np.stack([S.flatten(space, o) for o in samples]))


def test_vector_envs_see_a_flat_box():
    envs = make_vector_env(CueMatch, 3, "sync")
    try:
        assert envs.single_observation_space == S.Box(np.array([0, 0, 0, -1, -1]), np.array([1, 1, 1, 1, 1]),
                                                      dtype=np.float32)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 5) and obs.dtype == np.float32
        assert np.array_equal(obs[:, :3].sum(1), np.ones(3))  # the cue, one-hot
    finally:
        envs.close()


class TextObsEnv(CueMatch):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = S.Dict({"a": S.Text(5), "b": S.Discrete(2)})


def test_unsupported_sub_space_is_named():
    with pytest.raises(ValueError) as err:
        PPO(env=TextObsEnv)
    message = str(err.value)
    assert message.startswith("observation space Dict('a': Text(") and "has sub-space 'a' = Text(" in message
    assert message.endswith("which lightning_rl cannot encode: use Box, Discrete, MultiDiscrete, MultiBinary, "
                             "or Dict/Tuple of them")
    nested = S.Tuple((S.Discrete(2), S.Dict({"q": S.Sequence(S.Discrete(2))})))
    with pytest.raises(ValueError, match=r"has sub-space \[1\]\['q'\] = Sequence\("):
        flatten_observation_space(nested)


def test_algorithms_without_such_actions_name_the_space():
    with pytest.raises(ValueError, match=r"unsupported action space MultiDiscrete\(\[3 2\], start=\[1 0\]\): "
                                         "DQN needs Discrete actions"):
        DQN(env=CueMatch)
    with pytest.raises(ValueError, match=r"unsupported action space MultiBinary\(2\): SAC needs 1-D Box"):
        SAC(env=binary_cue_match)
    with pytest.raises(ValueError, match=r"unsupported action space MultiDiscrete\(\[\[2 2\]\]\)"):
        ActorCritic(S.Box(-1, 1, (2,)), S.MultiDiscrete([[2, 2]]))
    with pytest.raises(ValueError, match=r"Discrete\(3, start=1\): Discrete actions must start at 0"):
        ActorCritic(S.Box(-1, 1, (2,)), S.Discrete(3, start=1))


# ----------------------------------------------------------------------------- action heads
def test_action_head_distributions_match_the_spaces():
    obs = torch.zeros(4, 5)
    md = ActorCritic(S.Box(-1, 1, (5,)), S.MultiDiscrete([3, 2], start=[1, 0]))
    dist, _ = md(obs)
    assert isinstance(dist, MultiCategorical) and md.pi_head.out_features == 5
    mb = ActorCritic(S.Box(-1, 1, (5,)), S.MultiBinary(4))
    dist, _ = mb(obs)
    assert isinstance(dist, Bernoulli) and mb.pi_head.out_features == 4
    # a fresh head is near uniform: log-probs sum the components' log(1/n)
    out = md.compute_actions(obs, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["action_logp"], torch.full((4,), np.log(1 / 6), dtype=torch.float32),
                               atol=1e-2, rtol=0)
    assert out["actions"].shape == (4, 2) and out["actions"].dtype == torch.int64
    out = mb.compute_actions(obs, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["action_logp"], torch.full((4,), 4 * np.log(0.5), dtype=torch.float32),
                               atol=1e-2, rtol=0)


# ----------------------------------------------------------------------------- learning
RANDOM_STEP = (1 / 3 + 1 / 2) * 0.5  # CueMatch's expected reward a step under uniform random actions


def random_return(env_fn, episodes: int = 50, seed: int = 0) -> float:
    env = env_fn()
    env.action_space.seed(seed)
    total = 0.0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += reward
            done = terminated or truncated
    return total / episodes


def cue_ppo(**kwargs) -> PPO:
    settings = dict(env=CueMatch, num_envs=8, rollout_fragment_length=32, total_env_steps=3072, lr=3e-3,
                    num_sgd_iter=4, sgd_minibatch_size=128, hiddens=(32,), gamma=0.5, vectorization="sync")
    return PPO(**{**settings, **kwargs})


def cue_a2c(**kwargs) -> A2C:
    settings = dict(env=CueMatch, num_envs=8, rollout_fragment_length=16, total_env_steps=4096, lr=3e-3,
                    hiddens=(32,), gamma=0.5, vectorization="sync")
    return A2C(**{**settings, **kwargs})


@pytest.mark.parametrize("make", [cue_ppo, cue_a2c], ids=["ppo", "a2c"])
def test_learns_dict_observations_with_multi_discrete_actions(make):
    """Random actions earn about 3.3 of CueMatch's 8 a episode; both seeds' greedy policies
    match nearly every cue (measured: PPO 7.95, 7.88; A2C 7.88, 7.95 over 20 episodes)."""
    baseline = random_return(CueMatch)
    assert baseline == pytest.approx(8 * RANDOM_STEP, abs=0.4)
    for seed in (0, 1):
        model = make(seed=seed)
        quiet_trainer().fit(model)
        greedy = float(np.mean(evaluate(model, model.env_spec, 20, seed=123)))
        assert greedy > baseline + 3.5, (seed, greedy, baseline)


def test_impala_takes_the_same_spaces():
    """IMPALA shares the actor-critic: learns CueMatch in-process (measured 7.9 greedy after 4096 steps)."""
    model = IMPALA(env=CueMatch, num_workers=0, num_envs=8, rollout_fragment_length=32, total_env_steps=4096,
                   seed=0, lr=3e-3, hiddens=(32,), gamma=0.5, vectorization="sync")
    quiet_trainer().fit(model)
    greedy = float(np.mean(evaluate(model, model.env_spec, 20, seed=123)))
    assert greedy > random_return(CueMatch) + 3.5, greedy


def test_learns_multi_binary_actions():
    """MultiBinary(2) on CueMatch: random earns 4 of 8 (measured 7.83 greedy after 3072 steps)."""
    baseline = random_return(binary_cue_match)
    model = cue_ppo(env=binary_cue_match, seed=0)
    quiet_trainer().fit(model)
    greedy = float(np.mean(evaluate(model, model.env_spec, 20, seed=123)))
    assert greedy > baseline + 3.0, (greedy, baseline)


def test_recurrent_policy_reads_previous_multi_discrete_actions():
    """use_lstm with lstm_use_prev_action: a MultiDiscrete previous action (start included) is
    encoded per component; sampling, training and greedy evaluation run."""
    model = cue_ppo(use_lstm=True, lstm_use_prev_action=True, lstm_cell_size=8, max_seq_len=8,
                    sgd_minibatch_size=64, total_env_steps=512, seed=0)
    assert model.policies["default_policy"].action_dim == 5
    quiet_trainer().fit(model)
    assert model.counters["num_grad_updates"] > 0
    assert len(evaluate(model, model.env_spec, 2, seed=0)) == 2


# ----------------------------------------------------------------------------- inference
def test_predict_takes_one_raw_dict_observation():
    model = cue_ppo(seed=0)
    space = model.raw_observation_space
    assert isinstance(space, S.Dict) and model.observation_space.shape == (5,)
    space.seed(0)
    for deterministic in (False, True):
        obs = space.sample()
        action, state = model.predict(obs, deterministic=deterministic)
        assert state is None and action.shape == (2,) and model.action_space.contains(action), action
    # a batch in the Dict's structure: a row per observation, as if flattened first
    batch = {"cue": np.array([0, 1, 2]), "pos": np.array([[0.5, 0.1], [-0.5, 0.2], [0.9, -0.3]], np.float32)}
    actions = model.compute_actions(batch, explore=False)
    assert actions.shape == (3, 2) and all(model.action_space.contains(a) for a in actions)
    flat = flatten_observation(batch, space)
    np.testing.assert_array_equal(actions, model.compute_actions(flat, explore=False))


def test_export_policy_takes_flattened_observations(tmp_path):
    model = cue_ppo(seed=0)
    scripted = model.export_policy(tmp_path / "policy.pt")
    model.raw_observation_space.seed(1)
    raw = [model.raw_observation_space.sample() for _ in range(4)]
    flat = torch.as_tensor(np.stack([flatten_observation(o, model.raw_observation_space) for o in raw]))
    loaded = torch.jit.load(str(tmp_path / "policy.pt"))
    expected = np.stack([model.predict(o, deterministic=True)[0] for o in raw])
    np.testing.assert_array_equal(loaded(flat).numpy(), expected)
    np.testing.assert_array_equal(scripted(flat).numpy(), expected)


# ----------------------------------------------------------------------------- resume
def test_exact_resume_with_dict_observations_and_multi_discrete_actions(tmp_path):
    def make() -> PPO:
        return cue_ppo(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2,
                       total_env_steps=None, iterations_per_epoch=3, seed=0)

    full, first, resumed = fit_in_halves(make, tmp_path, batches=3)
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(first.parameters(), full.parameters(), strict=True))
