"""Box2D envs (the ``box2d`` extra, part of the ``test`` extra): their state lives in C structs,
so checkpoints cannot hold it; fit and every checkpoint save still succeed, and a resume restarts
the envs from re-seeded episodes with one warning naming the env and the attribute."""

from __future__ import annotations

import warnings

import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_rl import PPO
from tests.conftest import quiet_trainer

pytestmark = pytest.mark.timeout(180)

# Box2D's SWIG objects: the body of a world, or its contact listener
ATTRIBUTE = {"LunarLander-v3": "world", "BipedalWalker-v3": "world"}


def ppo(env: str) -> PPO:
    return PPO(env=env, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1,
               hiddens=(16,), seed=0, iterations_per_epoch=2, total_env_steps=None)


def weights(model: PPO) -> torch.Tensor:
    return torch.cat([t.detach().flatten().float() for t in model.state_dict().values()])


@pytest.mark.parametrize("env", ["LunarLander-v3", "BipedalWalker-v3"])
def test_box2d_fit_saves_and_resume_falls_back_to_reseeded_envs_with_one_warning(env, tmp_path):
    model = ppo(env)
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, callbacks=[saves])
        trainer.fit(model)  # three saves during fit, last.ckpt and one capture at teardown
        trainer.save_checkpoint(tmp_path / "end.ckpt")  # and one after
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "end.ckpt", "epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]
    assert [str(w.message) for w in caught if "env state" in str(w.message)] == []  # saving is silent
    state = torch.load(tmp_path / "epoch=1.ckpt", weights_only=True)["lightning_rl"]["datamodule"]["ranks"][0]
    assert "SwigPyObject" in state["envs"]["unsupported"]

    resumed = []
    for _ in range(2):
        again = ppo(env)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_trainer(max_epochs=3).fit(again, ckpt_path=tmp_path / "epoch=1.ckpt")
        env_warnings = [str(w.message) for w in caught if "env state" in str(w.message)]
        assert len(env_warnings) == 1, env_warnings
        assert f"of {env!r}" in env_warnings[0] and f".{ATTRIBUTE[env]}." in env_warnings[0]
        assert "re-seeded episodes" in env_warnings[0]
        for name in ("num_env_steps_sampled", "num_iterations"):  # the others count valid rows of other episodes
            assert again.counters[name] == model.counters[name], name
        resumed.append(weights(again))
    # re-seeded: the same checkpoint resumes to the same run
    torch.testing.assert_close(resumed[0], resumed[1], rtol=0, atol=0)
