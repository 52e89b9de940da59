"""Image entries of Dict observations (a CNN per image, the rest to the MLP) and SAC on image
observations (issue 25, first item)."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import DQN, PPO, SAC
from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs.spaces import FlatBox, flatten_observation, flatten_observation_space
from lightning_rl.evaluation import evaluate
from lightning_rl.nn.cnn import ImpalaCNN, MultiInputEncoder, NatureCNN, default_image_encoder
from tests.image_envs import BrightSide

Box, Dict = gym.spaces.Box, gym.spaces.Dict


class BrightSideDict(BrightSide):
    """``BrightSide``'s frame as the ``"frame"`` entry of a Dict beside a ``"noise"`` vector that
    carries no information (``cameras=True``: the frame split into two uint8 half-frames, the
    ``"left"`` and ``"right"`` cameras, and no vector)."""

    def __init__(self, cameras: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        frame = self.observation_space
        self.cameras = cameras
        if cameras:
            half = Box(0, 255, (self.size, self.size // 2, self.channels), np.uint8)
            self.observation_space = Dict({"left": half, "right": half})
        else:
            self.observation_space = Dict({"frame": frame, "noise": Box(-1.0, 1.0, (3,), np.float32)})

    def _frame(self) -> Any:
        frame = super()._frame()
        if self.cameras:
            half = self.size // 2
            return {"left": np.ascontiguousarray(frame[:, :half]), "right": np.ascontiguousarray(frame[:, half:])}
        return {"frame": frame, "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32)}


class BrightSideSteer(BrightSide):
    """``BrightSide`` with one continuous action: reward ``+a`` when the square is on the right,
    ``-a`` when on the left (``a`` in ``[-1, 1]``): random play returns about 0."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action_space = Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = float(np.clip(np.asarray(action).reshape(-1)[0], -1, 1))
        side = self._side
        _, _, terminated, truncated, info = super().step(1)
        return self._frame(), a if side else -a, terminated, truncated, info


def _fit(model: pl.LightningModule) -> None:
    pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model)


def test_the_encoding_keeps_the_structure_and_bytes_stay_bytes():
    image, vec = Box(0, 255, (16, 16, 1), np.uint8), Box(-1.0, 1.0, (3,), np.float32)
    mixed = flatten_observation_space(Dict({"frame": image, "noise": vec}))
    assert isinstance(mixed, FlatBox) and mixed.dtype == np.float32 and mixed.shape == (256 + 3,)
    assert [(path, columns) for path, _, columns in mixed.entries] == [("'frame'", (0, 256)), ("'noise'", (256, 259))]
    assert mixed == Box(mixed.low, mixed.high, dtype=np.float32)  # equal to the plain Box it was before
    cameras = Dict({"left": image, "right": image})
    assert flatten_observation_space(cameras).dtype == np.uint8  # every entry bytes, one an image
    sample = cameras.sample()
    flat = flatten_observation(sample, cameras)
    assert flat.dtype == np.uint8 and np.array_equal(flat[:256], sample["left"].reshape(-1))
    no_image = Dict({"a": Box(0, 255, (5,), np.uint8)})  # bytes but no image: float32, as before
    assert flatten_observation_space(no_image).dtype == np.float32
    assert flatten_observation(no_image.sample(), no_image).dtype == np.float32


def test_a_cnn_per_image_entry_and_the_other_columns_as_they_are():
    space = flatten_observation_space(Dict({
        "big": Box(0, 255, (40, 40, 3), np.uint8), "k": gym.spaces.Discrete(3),
        "small": Box(0, 255, (16, 16, 1), np.uint8), "v": Box(-1.0, 1.0, (2,), np.float32)}))
    assert default_image_encoder(space) == "multi_input"
    torch.manual_seed(0)
    encoder = MultiInputEncoder(space)
    big, small = encoder.cnns.values()
    assert isinstance(big, NatureCNN) and isinstance(small, ImpalaCNN)  # each image's own default
    assert encoder.out_features == 512 + 256 + 3 + 2
    rows = torch.as_tensor(np.stack([flatten_observation(space.structure.sample(), space.structure)
                                     for _ in range(3)]))
    expected = torch.cat([big(rows[:, :4800]), small(rows[:, 4803:5059]), rows[:, 4800:4803], rows[:, 5059:]], 1)
    torch.testing.assert_close(encoder(rows), expected, rtol=0, atol=0)
    assert isinstance(MultiInputEncoder(space, cnn="impala_cnn").cnns["0"], ImpalaCNN)
    with pytest.raises(ValueError, match="cnn must be one of"):
        MultiInputEncoder(space, cnn="resnet")
    with pytest.raises(ValueError, match="multi_input takes a flattened Dict"):
        MultiInputEncoder(Box(0, 255, (16, 16, 1), np.uint8))


def test_dict_image_observations_get_a_cnn_per_image_for_every_algorithm():
    ppo = PPO(env=BrightSideDict, seed=0)
    assert isinstance(ppo.policy.pi_encoder[0], MultiInputEncoder)
    dqn = DQN(env=BrightSideDict, seed=0)
    assert isinstance(dqn.policies["default_policy"].encoder[0], MultiInputEncoder)


def test_camera_bytes_stay_uint8_in_the_rollout():
    ppo = PPO(env=BrightSideDict, env_kwargs={"cameras": True}, seed=0, num_envs=2, rollout_fragment_length=8,
              sgd_minibatch_size=8, total_env_steps=16)
    seen = []
    ppo.postprocess = lambda batch, post=ppo.postprocess: (seen.append(
        batch.policy_batches["default_policy"][SampleBatch.OBS].dtype), post(batch))[1]
    _fit(ppo)
    assert seen == [torch.uint8]
    assert [type(cnn) for cnn in ppo.policy.pi_encoder[0].cnns.values()] == [ImpalaCNN, ImpalaCNN]


@pytest.mark.parametrize("cameras", [False, True], ids=["frame+noise", "two-cameras"])
def test_a_dict_image_policy_learns_the_synthetic_image_task(cameras):
    """PPO with a CNN per image entry learns which half the bright square is in (random: 10 of 20),
    the answer being only in the image(s), within 4,096 env steps."""
    model = PPO(env=BrightSideDict, env_kwargs={"cameras": cameras}, seed=0, total_env_steps=4096, num_envs=8,
                rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=4, hiddens=(), vf_share_layers=True,
                entropy_coeff=0.01)
    _fit(model)
    returns = evaluate(model, num_episodes=10, seed=123)
    assert np.mean(returns) >= 15.0, returns


def test_sac_on_image_observations_trains_a_cnn_per_network_on_uint8_replay():
    model = SAC(env=BrightSideSteer, seed=0, total_env_steps=96, learning_starts=64, buffer_size=128,
                train_batch_size=8, hiddens=(32,), iterations_per_epoch=32)
    actor, critics = model.policies["default_policy"], model.critics["default_policy"]
    assert isinstance(actor.encoder[1], ImpalaCNN)
    assert [type(encoder[1]) for encoder in critics.encoders] == [ImpalaCNN, ImpalaCNN]
    cnns = [actor.encoder[1], *(encoder[1] for encoder in critics.encoders)]
    before = [[p.detach().clone() for p in cnn.parameters()] for cnn in cnns]
    _fit(model)
    for cnn, old in zip(cnns, before):  # every network's CNN was trained
        assert any(not torch.equal(a, b) for a, b in zip(old, cnn.parameters()))
    replay = model.default_datamodule.buffer
    assert replay.sample(4)[SampleBatch.OBS].dtype == torch.uint8


def test_sac_without_images_keeps_its_mlps():
    model = SAC(env="Pendulum-v1", seed=0)
    assert model.critics["default_policy"].encoders is None
    assert all(isinstance(m, torch.nn.Linear | torch.nn.ReLU) for m in model.policies["default_policy"].encoder)


def test_cnn_gradients_keep_the_weights_memory_layout():
    """The learner's flat gradient buffer (``FlatGradients``, one all-reduce under DDP) lays each
    gradient out like its parameter (channels-last convolution weights included): backward
    accumulates into it in place without "grad and param do not obey the gradient layout
    contract" warnings, and the buffer holds the gradients."""
    from lightning_rl.distributed import FlatGradients

    model = PPO(env=BrightSide, seed=0)
    params = list(model.policy.parameters())
    assert any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last) for p in params)
    grads = FlatGradients(params)
    grads.zero()
    obs = torch.as_tensor(np.stack([model.observation_space.sample() for _ in range(8)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist, values = model.policy(obs)
        (dist.entropy().sum() + values.sum()).backward()
    assert all(p.grad.stride() == p.stride() for p in params)
    ends = grads.flat.data_ptr(), grads.flat.data_ptr() + grads.flat.numel() * grads.flat.element_size()
    assert all(ends[0] <= p.grad.data_ptr() < ends[1] for p in params)
    torch.testing.assert_close(grads.flat.norm(), torch.cat([p.grad.reshape(-1) for p in params]).norm())


def test_resume_with_dict_image_observations_is_exact(tmp_path):
    """Half a fit, a checkpoint, the other half: the same counters and weights (both cameras'
    CNNs), bit for bit, as one straight fit."""
    from tests.test_resume import straight_and_resumed, weights

    kwargs = dict(env=BrightSideDict, env_kwargs={"cameras": True}, seed=0, num_envs=2, rollout_fragment_length=16,
                  sgd_minibatch_size=16, num_sgd_iter=2, hiddens=(), vf_share_layers=True, iterations_per_epoch=2,
                  vectorization="sync")
    straight, resumed, _ = straight_and_resumed(PPO, kwargs, tmp_path, epochs=(2, 4))
    assert resumed.counters == straight.counters and straight.counters["num_env_steps_sampled"] == 4 * 2 * 32
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
