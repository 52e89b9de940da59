"""Image observations (issue 25, first part): which spaces are images, the CNN encoders of the
papers, CNNs chosen by default, uint8 kept up to the network, and a CNN policy that learns."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import DQN, IMPALA, PPO
from lightning_rl.batch import SampleBatch
from lightning_rl.evaluation import evaluate
from lightning_rl.nn.cnn import ImpalaCNN, NatureCNN, image_layout, image_shape
from tests.image_envs import BrightSide

Box = gym.spaces.Box


@pytest.mark.parametrize(("space", "layout"), [
    (Box(0, 255, (84, 84, 3), np.uint8), "HWC"),
    (Box(0, 255, (84, 84, 4), np.uint8), "HWC"),  # a frame stack, channels last
    (Box(0, 255, (4, 84, 84), np.uint8), "CHW"),  # a frame stack, channels first
    (Box(0, 255, (3, 64, 64), np.uint8), "CHW"),
    (Box(0, 255, (84, 84), np.uint8), "HW"),
    (Box(0, 1, (16, 16, 2), bool), "HWC"),
    (Box(0.0, 1.0, (16, 16, 1), np.float32), "HWC"),
    (Box(0.0, 255.0, (1, 16, 16), np.float32), "CHW"),
    (Box(-np.inf, np.inf, (16, 16, 1), np.float32), None),  # unbounded floats: not pixels
    (Box(-1.0, 1.0, (16, 16, 1), np.float32), None),
    (Box(0, 255, (84, 84, 3), np.int64), None),
    (Box(0, 255, (84,), np.uint8), None),
    (Box(0, 255, (2, 84, 84, 3), np.uint8), None),
    (gym.spaces.Discrete(4), None),
])
def test_which_spaces_are_images_and_their_layout(space, layout):
    assert image_layout(space) == layout


def test_image_shape_is_channels_first_and_a_non_image_is_refused():
    assert image_shape(Box(0, 255, (84, 80, 4), np.uint8)) == (4, 84, 80)
    assert image_shape(Box(0, 255, (4, 84, 80), np.uint8)) == (4, 84, 80)
    assert image_shape(Box(0, 255, (84, 80), np.uint8)) == (1, 84, 80)
    with pytest.raises(ValueError, match="is not an image"):
        image_shape(Box(-1.0, 1.0, (8,), np.float32))


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_nature_cnn_has_the_papers_layers_and_parameter_count():
    net = NatureCNN(Box(0, 255, (84, 84, 4), np.uint8))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                        (64, (3, 3), (1, 1))]
    # conv1 4*32*8*8+32, conv2 32*64*4*4+64, conv3 64*64*3*3+64, fc (64*7*7)*512+512
    assert _params(net) == (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64) + (3136 * 512 + 512)
    assert _params(net) == 1_684_128
    out = net(torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8))
    assert out.shape == (3, 512) and net.out_features == 512 and bool((out >= 0).all())


def test_impala_cnn_has_the_papers_blocks_and_parameter_count():
    net = ImpalaCNN(Box(0, 255, (84, 84, 4), np.uint8))
    conv = lambda i, o: i * o * 9 + o  # noqa: E731  a 3x3 convolution with bias
    stacks = sum(conv(i, o) + 4 * conv(o, o) for i, o in [(4, 16), (16, 32), (32, 32)])
    # 84 -> 42 -> 21 -> 11 after the three stride-2 max-pools, 32 channels, then 256 units
    assert _params(net) == stacks + (32 * 11 * 11 * 256 + 256) == 1_089_232
    assert net(torch.zeros(2, 84, 84, 4, dtype=torch.uint8)).shape == (2, 256)
    assert len([m for m in net.modules() if isinstance(m, torch.nn.MaxPool2d)]) == 3


def test_layouts_and_dtypes_reach_the_convolutions_the_same():
    """The same frames as HWC uint8, CHW uint8 and HWC float in [0, 1] give the same features
    with the same weights: the encoder moves channels first and scales uint8 by 1/255."""
    torch.manual_seed(0)
    hwc = NatureCNN(Box(0, 255, (36, 40, 2), np.uint8))
    chw = NatureCNN(Box(0, 255, (2, 36, 40), np.uint8))
    flt = NatureCNN(Box(0.0, 1.0, (36, 40, 2), np.float32))
    chw.load_state_dict(hwc.state_dict())
    flt.load_state_dict(hwc.state_dict())
    frames = torch.randint(0, 256, (2, 36, 40, 2), dtype=torch.uint8)
    expected = hwc(frames)
    torch.testing.assert_close(chw(frames.permute(0, 3, 1, 2)), expected)
    torch.testing.assert_close(flt(frames.float() / 255), expected)


def test_nature_cnn_refuses_images_it_cannot_convolve():
    with pytest.raises(ValueError, match="at least 36x36 pixels"):
        NatureCNN(Box(0, 255, (16, 16, 1), np.uint8))


@pytest.mark.parametrize(("size", "expected"), [(16, ImpalaCNN), (40, NatureCNN)])
def test_image_observations_get_a_cnn_by_default(size, expected):
    env = lambda: BrightSide(size=size)  # noqa: E731
    ppo = PPO(env=env, seed=0, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8)
    assert isinstance(ppo.policy.pi_encoder[1], expected) and isinstance(ppo.policy.vf_encoder[1], expected)
    dqn = DQN(env=env, seed=0)
    assert isinstance(dqn.policies["default_policy"].encoder[1], expected)
    assert isinstance(PPO(env="CartPole-v1").policy.pi_encoder[0], torch.nn.Linear)  # vectors: the MLP


def test_a_cnn_by_name_and_an_unknown_name():
    model = PPO(env=lambda: BrightSide(size=40), encoder="impala_cnn", vf_share_layers=True, seed=0, num_envs=2,
                rollout_fragment_length=8, sgd_minibatch_size=8)
    assert isinstance(model.policy.pi_encoder[1], ImpalaCNN) and model.policy.vf_encoder is None
    assert model.hparams["encoder"] == "impala_cnn"  # a checkpoint keeps the name
    with pytest.raises(ValueError, match="unknown encoder 'natur_cnn': use one of nature_cnn, impala_cnn"):
        PPO(env=BrightSide, encoder="natur_cnn")


def _fit(model: pl.LightningModule) -> None:
    pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model)


def test_uint8_frames_stay_uint8_in_the_rollout_and_the_replay():
    ppo = PPO(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8,
              total_env_steps=16)
    seen = []
    ppo.postprocess = lambda batch, post=ppo.postprocess: (seen.append(
        batch.policy_batches["default_policy"][SampleBatch.OBS].dtype), post(batch))[1]
    _fit(ppo)
    assert seen == [torch.uint8]  # one iteration of 16 env steps
    dqn = DQN(env=BrightSide, seed=0, total_env_steps=64, learning_starts=16, train_freq=16, num_gradient_steps=1,
              train_batch_size=8, buffer_size=64)
    _fit(dqn)
    buffer = dqn.default_datamodule.buffer
    assert buffer._obs.dtype == np.uint8 and buffer.sample(4)[SampleBatch.OBS].dtype == torch.uint8


def test_a_worker_slot_holds_uint8_frames():
    model = IMPALA(env=BrightSide, seed=0, num_workers=0, num_envs=2, rollout_fragment_length=8,
                   train_batch_size=16)
    dm = model.default_datamodule
    dm.connect(model)
    from lightning_rl.data.workers.task import _fragment_columns
    columns = _fragment_columns(model.policies["default_policy"], dm)
    assert columns[SampleBatch.OBS] == ((8, 2, 16, 16, 1), torch.uint8)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cnn_policy_learns_the_synthetic_image_task(seed):
    """PPO with the default CNN (IMPALA's, for 16x16 frames) learns which half of the frame the
    bright square is in within 4,096 env steps: a random policy returns about 10 of 20."""
    model = PPO(env=BrightSide, seed=seed, total_env_steps=4096, num_envs=8, rollout_fragment_length=16,
                sgd_minibatch_size=32, num_sgd_iter=4, hiddens=(), vf_share_layers=True, entropy_coeff=0.01)
    _fit(model)
    returns = evaluate(model, num_episodes=10, seed=123)
    assert np.mean(returns) >= 15.0, returns


def test_resume_with_image_observations_is_exact(tmp_path):
    """Half a fit, a checkpoint, the other half: the same counters and CNN weights, bit for bit,
    as one straight fit (the frames' envs resume where they were)."""
    from tests.test_resume import straight_and_resumed, weights

    kwargs = dict(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                  num_sgd_iter=2, hiddens=(), vf_share_layers=True, iterations_per_epoch=2, vectorization="sync")
    straight, resumed, _ = straight_and_resumed(PPO, kwargs, tmp_path, epochs=(2, 4))
    assert resumed.counters == straight.counters and straight.counters["num_env_steps_sampled"] == 4 * 2 * 32
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs", [
    dict(use_lstm=True, max_seq_len=8, lstm_cell_size=16),
    pytest.param(dict(compile=True), marks=pytest.mark.slow),  # about 100 s of compiling on 2 cores
], ids=["lstm", "compile"])
def test_a_cnn_runs_with_an_lstm_and_compiled(kwargs):
    """The CNN's features feed the LSTM; compiled, the update steps the same CNN (one short fit each)."""
    model = PPO(env=BrightSide, seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                num_sgd_iter=1, hiddens=(), total_env_steps=64, **kwargs)
    before = [p.detach().clone() for p in model.policy.pi_encoder[1].parameters()]
    _fit(model)
    assert isinstance(model.policy.pi_encoder[1], ImpalaCNN)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.pi_encoder[1].parameters()))
    if kwargs.get("compile"):
        assert all(step.compiled for step in model._update_steps.values())
