"""Multi-agent PPO/A2C/DQN over PettingZoo parallel envs: policy mapping, per-policy batches and
learning, agents that join and leave mid-episode, and clear errors."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import A2C, DQN, PPO
from tests.conftest import fit_in_halves, quiet_trainer, sample_once
from tests.multi_agent_envs import Relay, SilentRelay, by_agent

pytest.importorskip("pettingzoo")


def relay_ppo(**kwargs) -> PPO:
    settings = dict(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                    rollout_fragment_length=10, sgd_minibatch_size=8, num_sgd_iter=2, total_env_steps=200, seed=0,
                    iterations_per_epoch=5, hiddens=(16,))
    return PPO(**{**settings, **kwargs})


class Batches(pl.Callback):
    def __init__(self) -> None:
        self.batches, self.infos = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches.extend(getattr(batch, "batches", [batch]))  # A2C: an IterationStream's iterations
        self.infos.append(outputs["learner_info"])


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_only_the_trained_policy_changes_and_agent_steps_are_counted(algo):
    extra = {"sgd_minibatch_size": 8} if algo is PPO else {}
    model = algo(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent,
                 policies_to_train=["p_runner"], num_envs=2, rollout_fragment_length=10, total_env_steps=200,
                 seed=0, iterations_per_epoch=5, hiddens=(16,), **extra)
    before = copy.deepcopy(model.policies.state_dict())
    seen = Batches()
    quiet_trainer(max_epochs=-1, callbacks=[seen]).fit(model)
    after = model.policies.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("p_helper."))
    assert not all(torch.equal(before[k], after[k]) for k in before if k.startswith("p_runner."))
    assert all(list(info) == ["p_runner"] for info in seen.infos)
    rows = sum(b.policy_batches[p].count for b in seen.batches for p in b.policy_batches)
    runner_rows = sum(b.policy_batches["p_runner"].count for b in seen.batches)
    assert model.counters["num_agent_steps_sampled"] == rows > model.counters["num_env_steps_sampled"] == 200
    assert model.counters["num_agent_steps_trained"] == runner_rows
    assert len(model.configure_optimizers()) == 1


def test_agents_joining_and_leaving_give_exact_rows_and_per_agent_gae():
    """Relay: the runner acts at t = 0..3 and terminates at its 4th step; the helper joins at
    t = 2 and is truncated when the episode ends at t = 6. Every row is checked against that
    script, and each agent's advantages against a plain loop over its own trajectory."""
    model = relay_ppo(num_envs=1, rollout_fragment_length=12, gamma=0.9, lambda_=0.8)
    batch = sample_once(model)
    runner, helper = batch.policy_batches["p_runner"], batch.policy_batches["p_helper"]
    # two whole episodes of 6 steps: the runner acts 4 times in each, the helper 4 (t = 2..5)
    assert runner["obs"][:, 0].tolist() == [0, 1, 2, 3] * 2
    assert helper["obs"][:, 0].tolist() == [2, 3, 4, 5] * 2
    assert runner["terminateds"].tolist() == [False, False, False, True] * 2
    assert helper["truncateds"].tolist() == [False, False, False, True] * 2
    assert not helper["terminateds"].any() and not runner["truncateds"].any()
    actions = {"p_runner": runner["actions"], "p_helper": helper["actions"]}
    expected_rewards = {
        "p_runner": [t + 1 + 0.5 * a for t, a in zip([0, 1, 2, 3] * 2, actions["p_runner"].tolist())],
        "p_helper": [t + 1 + 10 + 0.5 * a for t, a in zip([2, 3, 4, 5] * 2, actions["p_helper"].tolist())],
    }
    for pid, rows in (("p_runner", runner), ("p_helper", helper)):
        assert rows["rewards"].tolist() == pytest.approx(expected_rewards[pid])
        policy = model.policies[pid]
        for episode in range(2):
            seg = slice(4 * episode, 4 * episode + 4)
            rewards, values = rows["rewards"][seg].tolist(), rows["vf_preds"][seg].tolist()
            if pid == "p_helper":  # truncated: bootstrap from the value of its final observation (t = 6)
                final = torch.tensor([[6.0, 1.0, float(episode)]])
                with torch.no_grad():
                    bootstrap = float(policy.value(final))
            else:  # terminated: no bootstrap
                bootstrap = 0.0
            adv, last = [0.0] * 4, 0.0
            for t in reversed(range(4)):
                next_value = values[t + 1] if t < 3 else bootstrap
                delta = rewards[t] + 0.9 * next_value - values[t]
                last = delta + 0.9 * 0.8 * last
                adv[t] = last
            assert rows["advantages"][seg].tolist() == pytest.approx(adv, rel=1e-5, abs=1e-5)
            assert rows["value_targets"][seg].tolist() == pytest.approx(
                [a + v for a, v in zip(adv, values)], rel=1e-5, abs=1e-5)
    assert batch.env_steps == 12 and batch.info["agent_steps_sampled"] == 16
    assert batch.info["episode_returns"] == pytest.approx(
        [sum(expected_rewards["p_runner"][4 * e: 4 * e + 4]) + sum(expected_rewards["p_helper"][4 * e: 4 * e + 4])
         for e in range(2)])


def test_a_fragment_cut_mid_episode_bootstraps_from_the_agents_current_observation():
    model = relay_ppo(num_envs=1, rollout_fragment_length=3, sgd_minibatch_size=2, gamma=0.5, lambda_=1.0)
    batch = sample_once(model)
    runner = batch.policy_batches["p_runner"]
    assert runner["obs"][:, 0].tolist() == [0, 1, 2]
    with torch.no_grad():
        bootstrap = float(model.policies["p_runner"].value(torch.tensor([[3.0, 0.0, 0.0]])))
    rewards = runner["rewards"].tolist()
    assert runner["value_targets"][-1].item() == pytest.approx(rewards[-1] + 0.5 * bootstrap, rel=1e-5)


def test_mapping_to_an_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match=r"policy_mapping_fn\('helper'\) returned 'nobody'"):
        relay_ppo(policy_mapping_fn=lambda a: "p_runner" if a == "runner" else "nobody")


def test_agents_with_different_spaces_on_one_policy_is_a_clear_error():
    with pytest.raises(ValueError, match=r"agents 'runner' and 'helper' are both mapped to policy 'shared'"):
        PPO(env=functools.partial(Relay, same_spaces=False), policies=["shared"], policy_mapping_fn=lambda a: "shared")


def test_policies_to_train_must_name_policies_and_single_agent_envs_take_no_mapping():
    with pytest.raises(ValueError, match="policies_to_train names"):
        relay_ppo(policies_to_train=["p_other"])
    with pytest.raises(ValueError, match="need a multi-agent env"):
        PPO(env="CartPole-v1", policies=["a", "b"])
    with pytest.raises(ValueError, match="no agent is mapped"):
        relay_ppo(policies=["p_runner", "p_helper", "p_idle"])


def test_per_policy_settings_and_parameter_sharing_by_default():
    model = relay_ppo(policies={"p_runner": {"hiddens": (8,)}, "p_helper": {}})
    sizes = {pid: sum(p.numel() for p in model.policies[pid].parameters()) for pid in model.policies}
    # obs 3 -> hidden -> (2 logits, 1 value), separate actor and critic trunks
    assert sizes == {"p_runner": 2 * (3 * 8 + 8) + (8 * 2 + 2) + (8 + 1),
                     "p_helper": 2 * (3 * 16 + 16) + (16 * 2 + 2) + (16 + 1)}
    shared = PPO(env=Relay, num_envs=1, rollout_fragment_length=12, sgd_minibatch_size=8, hiddens=(8,))
    assert list(shared.policies) == ["default_policy"]  # every agent acts with the one default policy
    batch = sample_once(shared)
    assert list(batch.policy_batches) == ["default_policy"] and batch.policy_batches["default_policy"].count == 16


def test_synchronous_multi_agent_runs_are_deterministic():
    a, b = relay_ppo(), relay_ppo()
    quiet_trainer(max_epochs=-1).fit(a)
    quiet_trainer(max_epochs=-1).fit(b)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    assert np.isfinite([p.detach().sum().item() for p in a.parameters()]).all()


def test_evaluation_plays_team_episodes_with_each_agents_policy():
    """Greedy team returns; Lightning validation logs them like a single-agent run's."""
    from lightning_rl import evaluate

    model = relay_ppo(evaluation_interval=1, evaluation_num_episodes=2)
    returns = evaluate(model, num_episodes=3, seed=0)
    # every episode: runner rewards t + 0.5a for t = 1..4, helper 10 + t + 0.5a for t = 3..6
    assert len(returns) == 3 and all(10 + 58 <= r <= 10 + 58 + 4 for r in returns)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(model)
    assert 68 <= float(trainer.callback_metrics["val/episode_return_mean"]) <= 72


def test_resume_is_bit_exact_for_a_single_process_multi_agent_run(tmp_path):
    """Stopped after epoch 1 (mid-episode: 10-step fragments, 6-step episodes), checkpointed and
    resumed: counters, both policies' weights and the envs continue as in an uninterrupted run."""
    full, _, resumed = fit_in_halves(relay_ppo, tmp_path, batches=3)
    assert resumed.counters == full.counters and resumed.counters["num_iterations"] == 6
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_each_policys_return_is_logged_beside_the_team_return():
    model = relay_ppo()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=5, log_every_n_steps=1)
    trainer.fit(model)
    m = trainer.callback_metrics
    runner, helper = float(m["rollout/policy_return_mean/p_runner"]), float(m["rollout/policy_return_mean/p_helper"])
    assert 10 <= runner <= 12 and 58 <= helper <= 60  # 1+2+3+4 (+0.5 per action 1); 13+14+15+16 (+ ...)
    assert float(m["rollout/episode_return_mean"]) == pytest.approx(runner + helper)


def test_a_mapping_given_as_a_table_reloads_from_the_checkpoint_and_a_function_must_be_given_again(tmp_path):
    table = {"runner": "p_runner", "helper": "p_helper"}
    model = relay_ppo(policy_mapping_fn=table)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, default_root_dir=tmp_path)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "table.ckpt")
    loaded = PPO.load_from_checkpoint(tmp_path / "table.ckpt", env=Relay)
    assert loaded.policy_mapping_fn("helper") == "p_helper"
    for x, y in zip(loaded.parameters(), model.parameters()):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="'intruder' is not in policy_mapping_fn"):
        loaded.policy_mapping_fn("intruder")

    model = relay_ppo()  # a function: kept as a placeholder, to be passed again
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, default_root_dir=tmp_path)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "fn.ckpt")
    with pytest.raises(ValueError, match=r"policy_mapping_fn=<callable tests\.multi_agent_envs\.by_agent>"):
        PPO.load_from_checkpoint(tmp_path / "fn.ckpt", env=Relay)
    assert PPO.load_from_checkpoint(tmp_path / "fn.ckpt", env=Relay, policy_mapping_fn=by_agent).policies.keys() \
        == model.policies.keys()


def test_algorithms_without_multi_agent_support_say_so():
    """... and name every algorithm that does (by its ``supports_multi_agent``), not a stale list."""
    import lightning_rl
    from lightning_rl import A3C, APEX, SAC, TD3

    takes = [name for name in ("A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3")
             if getattr(lightning_rl, name).supports_multi_agent]
    assert "DQN" in takes and "IMPALA" in takes and "APPO" in takes
    for algo in (SAC, TD3, APEX, A3C):
        with pytest.raises(ValueError) as error:
            algo(env=Relay)
        assert str(error.value) == (f"{algo.__name__} does not take multi-agent (PettingZoo) envs; "
                                    f"{', '.join(takes)} do")


def test_counting_by_agent_steps_sizes_batches_and_the_budget_in_agents_steps():
    """Relay's agents per step are 1, 1, 2, 2, 1, 1 (runner alone, both, helper alone): a
    train batch of 5 agent steps takes 4 env steps (1 + 1 + 2 + 2 = 6 rows), where counting
    env steps takes 5 env steps (7 rows)."""
    by_env = sample_once(relay_ppo(num_envs=1, rollout_fragment_length=5, sgd_minibatch_size=4))
    assert (by_env.env_steps, by_env.info["agent_steps_sampled"]) == (5, 7)
    model = relay_ppo(num_envs=1, rollout_fragment_length=5, count_steps_by="agent_steps", total_env_steps=30,
                      sgd_minibatch_size=4)
    by_agent_steps = sample_once(model)
    assert (by_agent_steps.env_steps, by_agent_steps.info["agent_steps_sampled"]) == (4, 6)
    assert sum(b.count for b in by_agent_steps.policy_batches.values()) == 6

    seen = Batches()
    quiet_trainer(max_epochs=-1, callbacks=[seen]).fit(model)
    agent_steps = [b.info["agent_steps_sampled"] for b in seen.batches]
    assert all(n >= 5 for n in agent_steps)
    c = model.counters
    assert c["num_agent_steps_sampled"] == sum(agent_steps) >= 30 > sum(agent_steps[:-1])  # the budget: agent steps
    assert c["num_env_steps_sampled"] == sum(b.env_steps for b in seen.batches) < c["num_agent_steps_sampled"]
    assert c["num_env_steps_trained"] == c["num_env_steps_sampled"]
    assert c["num_agent_steps_trained"] == c["num_agent_steps_sampled"]
    with pytest.raises(ValueError, match="count_steps_by must be"):
        relay_ppo(count_steps_by="steps")


def test_an_env_factory_named_by_its_import_path_builds_and_reloads_from_the_checkpoint(tmp_path):
    """How YAML and the CLI name a PettingZoo env: ``package.module.factory``. The checkpoint
    keeps the string, so loading needs no env argument."""
    model = PPO(env="tests.multi_agent_envs.Relay", policies={"p_runner": {}, "p_helper": {}},
                policy_mapping_fn={"runner": "p_runner", "helper": "p_helper"}, num_envs=1,
                rollout_fragment_length=6, sgd_minibatch_size=4, num_sgd_iter=1, total_env_steps=6, seed=0)
    assert model.multi_agent and model.env_spec is Relay
    trainer = quiet_trainer(max_epochs=-1, default_root_dir=tmp_path)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "path.ckpt")
    loaded = PPO.load_from_checkpoint(tmp_path / "path.ckpt")
    assert loaded.env_spec is Relay and loaded.hparams.env == "tests.multi_agent_envs.Relay"
    assert all(torch.equal(x, y) for x, y in zip(loaded.parameters(), model.parameters()))
    with pytest.raises(ValueError, match=r"unknown env id 'tests\.multi_agent_envs\.Nothing'"):
        PPO(env="tests.multi_agent_envs.Nothing")


def test_an_env_module_that_fails_to_import_is_named_in_the_error(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import not_installed_anywhere\n\ndef env():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="needs_missing_dep failed: No module named 'not_installed_anywhere'"):
        PPO(env="needs_missing_dep.env")


def relay_dqn(**kwargs) -> DQN:
    settings = dict(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                    train_freq=6, learning_starts=12, num_gradient_steps=2, train_batch_size=8, buffer_size=100,
                    target_network_update_freq=24, total_env_steps=120, seed=0, iterations_per_epoch=5,
                    hiddens=(16,))
    return DQN(**{**settings, **kwargs})


def test_dqn_replays_n_step_transitions_along_each_agents_own_trajectory():
    """Relay with n_step=2, gamma=0.9: the runner acts at t = 0..3 and terminates, the helper
    acts at t = 2..5 and is truncated. Every transition in each policy's replay is checked
    against that script: returns summed over the agent's own next steps, the window cut at
    its termination (no bootstrap) and at its truncation (bootstrap from its final observation)."""
    model = relay_dqn(num_envs=1, train_freq=12, learning_starts=10**6, n_step=2, gamma=0.9)
    sample_once(model)
    dm = model.default_datamodule
    for pid, index, times in (("p_runner", 0, range(4)), ("p_helper", 1, range(2, 6))):
        buffer = dm.buffers[pid]
        cols = {k: v[: len(buffer)] for k, v in buffer._columns.items()}
        assert len(buffer) == 8  # 4 steps in each of 2 episodes
        action = {(int(o[2]), int(o[0])): int(a) for o, a in zip(cols["obs"], cols["actions"])}
        for n in range(len(buffer)):
            t, episode = int(cols["obs"][n][0]), int(cols["obs"][n][2])
            assert t in times and cols["obs"][n][1] == index
            window = [s for s in (t, t + 1) if s in times]
            rewards = [s + 1 + 10 * index + 0.5 * action[(episode, s)] for s in window]  # Relay's reward
            expected = sum(0.9 ** k * r for k, r in enumerate(rewards))
            assert cols["rewards"][n] == pytest.approx(expected, rel=1e-6)
            assert cols["next_obs"][n].tolist() == [window[-1] + 1, index, episode]
            assert cols["discounts"][n] == pytest.approx(0.9 ** len(window))
            assert bool(cols["terminateds"][n]) == (pid == "p_runner" and window[-1] == 3)


def test_dqn_trains_only_its_policies_to_train_each_from_its_own_replay():
    model = relay_dqn(policies_to_train=["p_runner"])
    before = copy.deepcopy(model.state_dict())
    seen = Batches()
    quiet_trainer(max_epochs=-1, callbacks=[seen]).fit(model)
    after = model.state_dict()
    helper = [k for k in before if ".p_helper." in f".{k}"]
    runner = [k for k in before if k.startswith("policies.p_runner.")]
    assert helper and all(torch.equal(before[k], after[k]) for k in helper)  # online and target alike
    assert not all(torch.equal(before[k], after[k]) for k in runner)
    assert all(list(info) == ["p_runner"] for info in seen.infos if info)
    c = model.counters
    assert c["num_agent_steps_sampled"] == sum(b.info["agent_steps_sampled"] for b in seen.batches) > 120
    assert c["num_agent_steps_trained"] == c["num_grad_updates"] * 8  # rows replayed, the runner's only
    assert len(model.default_datamodule.buffers["p_helper"]) > 0 and len(model.configure_optimizers()) == 1


def test_dqn_multi_agent_resume_is_bit_exact(tmp_path):
    """Stopped mid-episode with n-step windows open: replay, windows, envs and counters resume."""
    kwargs = dict(n_step=3, prioritized_replay=True, train_freq=5, total_env_steps=10**6)  # stops mid-episode
    full, _, resumed = fit_in_halves(lambda: relay_dqn(**kwargs), tmp_path, batches=3)
    assert resumed.counters == full.counters and resumed.counters["num_grad_updates"] > 0
    for x, y in zip(resumed.state_dict().values(), full.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_an_agent_dropped_without_a_done_flag_is_cut_as_a_truncation():
    """SilentRelay's helper disappears at the episode end with no flag: PPO bootstraps its last
    segment from its final observation, DQN's last windows end there (not terminated), and
    no window runs into the next episode."""
    model = relay_dqn(env=SilentRelay, num_envs=1, train_freq=12, learning_starts=10**6, n_step=2, gamma=0.9)
    sample_once(model)
    buffer = model.default_datamodule.buffers["p_helper"]
    cols = {k: v[: len(buffer)] for k, v in buffer._columns.items()}
    assert len(buffer) == 8 and not cols["terminateds"].any()
    assert sorted(o[0] for o in cols["next_obs"].tolist()) == [4, 4, 5, 5, 6, 6, 6, 6]  # t = 5 and t = 4 end at 6
    assert all(n[2] == o[2] for n, o in zip(cols["next_obs"].tolist(), cols["obs"].tolist()))  # same episode

    ppo = relay_ppo(env=SilentRelay, num_envs=1, rollout_fragment_length=12, gamma=0.9, lambda_=0.8)
    helper = sample_once(ppo).policy_batches["p_helper"]
    assert not helper["terminateds"].any() and not helper["truncateds"].any() and helper.count == 8
    with torch.no_grad():  # the last step's value target bootstraps from the final observation (t = 6)
        bootstrap = float(ppo.policies["p_helper"].value(torch.tensor([[6.0, 1.0, 0.0]])))
    assert float(helper["value_targets"][3]) == pytest.approx(float(helper["rewards"][3]) + 0.9 * bootstrap, rel=1e-5)


def test_compiled_multi_agent_a2c_pads_to_one_shape_and_matches_eager():
    """A2C steps once on a policy's whole batch, whose rows vary with its agents: compiled, it
    pads to the most rows the policy can have, so each policy's graph compiles once."""
    kwargs = dict(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                  rollout_fragment_length=7, total_env_steps=14 * 4, seed=0, hiddens=(16,))
    eager = A2C(**kwargs)
    quiet_trainer(max_epochs=-1).fit(eager)
    torch.compiler.reset()
    compiled = A2C(**kwargs, compile=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        quiet_trainer(max_epochs=-1).fit(compiled)
    assert all(step.compiled for step in compiled._update_steps.values())
    assert compiled.most_policy_rows("p_helper") == 14 and compiled.most_policy_rows("p_runner") == 14
    for x, y in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def relay_impala(algo=None, **kwargs):
    from lightning_rl import IMPALA

    settings = dict(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_workers=0,
                    num_envs=2, rollout_fragment_length=5, train_batch_size=10, total_env_steps=100, seed=0,
                    iterations_per_epoch=5, hiddens=(16,), sampler_timeout_s=30.0)
    return (algo or IMPALA)(**{**settings, **kwargs})


def test_impala_fragments_have_a_time_major_column_per_env_and_agent():
    """Relay, 7-step fragments: the runner acts at t = 0..3 and terminates; the next row holds
    its final observation (invalid), as V-trace reads it. The episode ends at t = 5 (the
    helper truncated) and the env spends t = 6 on its reset; the helper joins at t = 2."""
    batch = sample_once(relay_impala(num_envs=1, rollout_fragment_length=7, train_batch_size=7))
    runner, helper = batch.policy_batches["p_runner"], batch.policy_batches["p_helper"]
    assert runner["obs"].shape == (7, 1, 3) and runner["bootstrap_obs"].shape == (1, 3)
    assert runner["valid"][:, 0].tolist() == [True] * 4 + [False] * 3
    assert runner["obs"][:5, 0, 0].tolist() == [0, 1, 2, 3, 4]  # t = 4: the final observation after it left
    assert runner["terminateds"][:, 0].tolist() == [False] * 3 + [True] + [False] * 3
    assert helper["valid"][:, 0].tolist() == [False, False, True, True, True, True, False]
    assert helper["obs"][2:7, 0, 0].tolist() == [2, 3, 4, 5, 6]  # t = 6: its final observation (the reset step)
    assert helper["truncateds"][:, 0].tolist() == [False] * 5 + [True, False]
    assert not helper["terminateds"].any()
    assert batch.env_steps == 7 and batch.info["agent_steps_sampled"] == 8
    # the fragment ended on the reset step: the next fragment starts the new episode
    assert runner["bootstrap_obs"][0].tolist() == [0, 0, 1]


@pytest.mark.parametrize("algo_name", ["IMPALA", "APPO"])
def test_impala_and_appo_train_only_their_policies_to_train_with_sampler_workers(algo_name):
    import lightning_rl
    from tests.test_async import children
    from tests.test_env_faults import live_pids

    model = relay_impala(getattr(lightning_rl, algo_name), num_workers=1, policies_to_train=["p_runner"])
    before = copy.deepcopy(model.policies.state_dict())
    seen = Batches()
    processes = set(children())
    quiet_trainer(max_epochs=-1, callbacks=[seen]).fit(model)
    assert not live_pids([p for p in children() if p not in processes], grace_s=3.0)  # the worker is gone
    after = model.policies.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("p_helper."))
    assert not all(torch.equal(before[k], after[k]) for k in before if k.startswith("p_runner."))
    assert all(list(info) == ["p_runner"] for info in seen.infos)
    valid = {p: sum(int(b.policy_batches[p]["valid"].sum()) for b in seen.batches) for p in ("p_runner", "p_helper")}
    assert model.counters["num_agent_steps_sampled"] == valid["p_runner"] + valid["p_helper"]
    assert model.counters["num_agent_steps_trained"] == valid["p_runner"] > 0
    assert model.counters["num_env_steps_sampled"] == 100


def test_a_worker_samples_the_multi_agent_fragment_the_learner_process_samples():
    from tests.test_async import children
    from tests.test_env_faults import live_pids

    processes = set(children())
    models = (relay_impala(num_workers=0), relay_impala(num_workers=1))
    dms = [m.default_datamodule for m in models]
    for m, dm in zip(models, dms):
        dm.connect(m)
        dm.setup("fit")
    try:
        a, b = (dm.sample() for dm in dms)
        for pid in ("p_runner", "p_helper"):
            for key in ("obs", "actions", "action_logp", "rewards", "terminateds", "truncateds", "valid",
                        "bootstrap_obs"):
                torch.testing.assert_close(a.policy_batches[pid][key], b.policy_batches[pid][key], rtol=0, atol=0)
    finally:
        for dm in dms:
            dm.close()
    assert not live_pids([p for p in children() if p not in processes], grace_s=3.0)  # the worker is gone


def test_impala_multi_agent_resume_is_bit_exact_without_workers(tmp_path):
    kwargs = dict(rollout_fragment_length=4, train_batch_size=8, total_env_steps=10**6)  # stops mid-episode
    full, _, resumed = fit_in_halves(lambda: relay_impala(**kwargs), tmp_path, batches=3)
    assert resumed.counters == full.counters and resumed.counters["num_iterations"] == 6
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
