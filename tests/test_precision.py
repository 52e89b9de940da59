"""``Trainer(precision="bf16-mixed")``: the learner's forward and backward passes under bfloat16
autocast, weights, optimizer state and clipping in float32; other precisions refused by name."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import DQN, IMPALA, PPO, SAC, TD3, update
from lightning_rl.evaluation import evaluate
from lightning_rl.nn.models import ActorCritic, Float32Linear
from lightning_rl.nn.q_models import QNetwork, SquashedGaussianActor, TwinQ
from tests.image_envs import BrightSide
from tests.test_pixels_dict import BrightSideSteer


def _fit(model: pl.LightningModule, precision: str = "bf16-mixed") -> None:
    pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, precision=precision).fit(model)


def _first_conv(model: pl.LightningModule) -> torch.nn.Conv2d:
    return next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))


@pytest.mark.parametrize("make", [
    lambda: PPO(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                total_env_steps=64, grad_clip=0.5),
    lambda: DQN(env=BrightSide, seed=0, total_env_steps=96, learning_starts=32, train_freq=8, train_batch_size=8,
                buffer_size=128),
    lambda: IMPALA(env=BrightSide, seed=0, num_workers=0, num_envs=2, rollout_fragment_length=8,
                   train_batch_size=16, total_env_steps=64),
    lambda: SAC(env=BrightSideSteer, seed=0, total_env_steps=48, learning_starts=32, buffer_size=64,
                train_batch_size=8, hiddens=(16,), iterations_per_epoch=16),
    lambda: TD3(env=BrightSideSteer, seed=0, total_env_steps=48, learning_starts=32, buffer_size=64,
                train_batch_size=8, hiddens=(16,), iterations_per_epoch=16),
], ids=["ppo", "dqn", "impala", "sac", "td3"])
def test_bf16_mixed_trains_in_bfloat16_with_float32_weights(make):
    model = make()
    conv = _first_conv(model)
    before = conv.weight.detach().clone()
    seen: list[tuple[bool, torch.dtype]] = []
    conv.register_forward_hook(lambda m, args, out: seen.append((torch.is_grad_enabled(), out.dtype)))
    _fit(model)
    learning = {dtype for grad, dtype in seen if grad}
    assert learning == {torch.bfloat16}  # every forward that backpropagated ran under bf16 autocast
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not torch.equal(before, conv.weight) and torch.isfinite(conv.weight).all()
    for opt in model.trainer.optimizers:
        assert all(v.dtype == torch.float32 for state in opt.state.values() for k, v in state.items() if k != "step")


def test_a_cnn_policy_learns_in_bf16():
    """The synthetic image task of tests/test_pixels.py, learned the same way in bf16-mixed."""
    model = PPO(env=BrightSide, seed=0, total_env_steps=4096, num_envs=8, rollout_fragment_length=16,
                sgd_minibatch_size=32, num_sgd_iter=4, hiddens=(), vf_share_layers=True, entropy_coeff=0.01)
    _fit(model)
    assert np.mean(evaluate(model, num_episodes=10, seed=123)) >= 15.0


def test_grad_clip_bounds_the_update_in_bf16():
    """Norm clipping still applies under bf16 autocast (Lightning's own refuses fused optimizers
    under mixed precision): the one minibatch update clips the gradients' global norm to
    ``grad_clip``; without ``grad_clip`` nothing is clipped."""
    def run(clip: float | None) -> torch.Tensor:
        model = PPO(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=32,
                    num_sgd_iter=1, total_env_steps=32, grad_clip=clip)
        params = [p.detach().clone() for p in model.parameters()]
        grads: list[torch.Tensor] = []
        original = update.clip_grad_norm  # the eager step's clipping (clip_grad_norm_'s arithmetic)

        def spy(parameters, max_norm):  # the norm after clipping
            parameters = list(parameters)
            original(parameters, max_norm)
            grads.append(torch.sqrt(sum(p.grad.float().pow(2).sum() for p in parameters)))

        update.clip_grad_norm = spy
        try:
            _fit(model)
        finally:
            update.clip_grad_norm = original
        assert any(not torch.equal(a, b) for a, b in zip(params, model.parameters()))
        return torch.stack(grads) if grads else torch.zeros(0)

    clipped = run(1e-3)
    assert len(clipped) == 1 and clipped.item() <= 1e-3 * (1 + 1e-3)
    assert len(run(None)) == 0


@pytest.mark.parametrize("precision", ["64-true", "bf16-true"])
def test_other_precisions_are_refused_by_name(precision):
    model = PPO(env="CartPole-v1", seed=0, total_env_steps=64)
    with pytest.raises(ValueError, match=f"precision '32-true' or 'bf16-mixed', got '{precision}'"):
        _fit(model, precision)


@pytest.mark.parametrize("clip, precision, warns", [
    ({"clip_param_schedule": "linear"}, "bf16-mixed", True),  # decays to 0
    ({"clip_param_schedule": [[0, 0.1], [64, 0.01]]}, "bf16-mixed", True),
    ({"clip_param": 0.01}, "bf16-mixed", True),
    ({"clip_param_schedule": [[0, 0.2], [64, 0.02]]}, "bf16-mixed", False),
    ({}, "bf16-mixed", False),  # constant 0.2
    ({"clip_param_schedule": "linear"}, "32-true", False),
], ids=["linear-bf16", "to-0.01-bf16", "0.01-bf16", "to-0.02-bf16", "constant-bf16", "linear-fp32"])
def test_ppo_warns_of_a_clip_range_bf16_rounding_would_decide(clip, precision, warns, recwarn):
    """Under bf16 the ratio starts an update off 1 by bf16's rounding (docs/guides/compile.md):
    a clip range that reaches below 0.02 is warned of, once, naming the floor; float32 is not."""
    _fit(PPO(env="CartPole-v1", seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
             total_env_steps=64, **clip), precision)
    found = [w for w in recwarn if "clip range goes down to" in str(w.message)]
    assert len(found) == (1 if warns else 0)
    if warns:
        assert "0.02" in str(found[0].message) and "bf16" in str(found[0].message)


def test_a_float32_head_computes_in_float32_under_autocast_and_is_a_linear_otherwise():
    torch.manual_seed(0)
    head, plain = Float32Linear(16, 3), torch.nn.Linear(16, 3)
    plain.load_state_dict(head.state_dict())  # same parameters and names: checkpoints of nn.Linear heads load
    x = torch.randn(5, 16, requires_grad=True)
    assert torch.equal(head(x), plain(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        features = x * 1.0
        assert plain(features).dtype == torch.bfloat16
        out = head(features.bfloat16())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.nn.functional.linear(x.bfloat16().float(), head.weight, head.bias),
                               rtol=0, atol=0)
    out.sum().backward()
    assert x.grad is not None and head.weight.grad.dtype == torch.float32


def test_every_output_head_is_float32():
    """The layers whose outputs losses compare (logits, values, Q-values, Gaussian parameters)."""
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    vector = gym.spaces.Box(-1, 1, (3,), np.float32)
    nets = [ActorCritic(image, gym.spaces.Discrete(6)), QNetwork(image, gym.spaces.Discrete(6), dueling=True),
            SquashedGaussianActor(vector, gym.spaces.Box(-1, 1, (2,))), TwinQ(vector, 2)]
    heads = [m for net in nets for m in net.modules() if isinstance(m, Float32Linear)]
    assert len(heads) == 2 + 2 + 1 + 2


def test_under_bf16_the_learner_log_probs_match_the_float32_actor_s():
    """Why the heads are float32: with the Nature CNN's trunk in bf16 the log-probs of the same
    weights differ from float32 by far less than PPO's clip ranges (with a bf16 head the median
    difference was 0.0042 at initialization, benchmarks/bf16_ratio.py), and values likewise."""
    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), hiddens=[],
                      vf_share_layers=True)
    obs = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 6, (64,))
    with torch.no_grad():
        dist, values = net(obs)
        logp32 = dist.log_prob(actions)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dist16, values16 = net(obs)
            logp16 = dist16.log_prob(actions)
    assert logp16.dtype == values16.dtype == torch.float32
    assert (logp16 - logp32).abs().max() < 1e-3
    assert (values16 - values).abs().max() < 0.05 * values.abs().max()


def _graph_nodes(graphs: list[torch.fx.GraphModule], name: str) -> list[torch.fx.Node]:
    """Calls of ``name`` (e.g. ``conv2d``) in the graphs dynamo captured, higher-order ops' bodies included."""
    return [node for graph in graphs for module in graph.modules() if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes if node.op == "call_function" and name in str(node.target)]


@pytest.mark.parametrize("make", [
    lambda: PPO(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                total_env_steps=64, compile=True, hiddens=(), vf_share_layers=True),
    lambda: DQN(env=BrightSide, seed=0, total_env_steps=64, learning_starts=32, train_freq=8, train_batch_size=8,
                buffer_size=128, compile=True),
], ids=["ppo", "dqn"])
def test_a_compiled_update_under_bf16_convolves_in_bfloat16_with_float32_heads(make, monkeypatch):
    """``compile=True`` with ``bf16-mixed``: the update graphs torch.compile captures (recorded by a
    backend that runs them as captured) carry the autocast: every convolution's output is bfloat16,
    the hidden linear layers' too, and the output heads' (``Float32Linear``) float32."""
    graphs: list[torch.fx.GraphModule] = []
    real = torch.compile

    def recording(fn, **kwargs):
        def backend(graph, example_inputs):
            graphs.append(graph)
            return graph.forward
        return real(fn, fullgraph=kwargs.get("fullgraph", False), backend=backend)

    monkeypatch.setattr(torch, "compile", recording)
    model = make()
    _fit(model)
    convs, linears = _graph_nodes(graphs, "conv2d"), _graph_nodes(graphs, "linear")
    assert convs and {node.meta["example_value"].dtype for node in convs} == {torch.bfloat16}
    widths = {m.out_features for m in model.modules() if isinstance(m, Float32Linear)}
    heads = [n for n in linears if n.meta["example_value"].shape[-1] in widths]
    hidden = [n for n in linears if n.meta["example_value"].shape[-1] not in widths]
    assert heads and {n.meta["example_value"].dtype for n in heads} == {torch.float32}
    assert hidden and {n.meta["example_value"].dtype for n in hidden} == {torch.bfloat16}
