"""Oracle tests for LearnerInfoBuilder's reduction rules (docs/design.md, "Core contracts")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder


def finalize(*results: dict, policy_id: str = DEFAULT_POLICY_ID) -> dict:
    builder = LearnerInfoBuilder()
    for r in results:
        builder.add_learn_on_batch_results(r, policy_id)
    info = builder.finalize()
    assert list(info) == [policy_id]
    return info[policy_id]


def test_default_policy_id():
    builder = LearnerInfoBuilder()
    builder.add_learn_on_batch_results({"loss": 1.0})
    assert builder.finalize() == {"default_policy": {"loss": 1.0}}


# --------------------------------------------------------------------------- td_error


def test_td_error_concatenated_in_order():
    out = finalize({"td_error": np.array([1.0, 2.0])}, {"td_error": np.array([3.0])}, {"td_error": [4.0, 5.0, 6.0]})
    np.testing.assert_array_equal(np.asarray(out["td_error"]), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def test_td_error_torch_tensors_concatenated_in_order():
    t1 = torch.tensor([0.5, -1.0, 2.0], requires_grad=True) * 2  # has a graph: must be detached
    t2 = torch.tensor([7.0, 8.0])
    out = finalize({"td_error": t1}, {"td_error": t2})
    td = out["td_error"]
    assert not isinstance(td, torch.Tensor)
    np.testing.assert_allclose(np.asarray(td), [1.0, -2.0, 4.0, 7.0, 8.0])


def test_td_error_single_call_and_scalars_kept():
    out = finalize({"td_error": torch.tensor([3.0, 1.0, 2.0])})
    np.testing.assert_array_equal(np.asarray(out["td_error"]), [3.0, 1.0, 2.0])
    out = finalize({"td_error": 1.5}, {"td_error": torch.tensor(2.5)})
    np.testing.assert_array_equal(np.asarray(out["td_error"]), [1.5, 2.5])


def test_td_error_nested_under_policy_results_is_not_averaged():
    out = finalize(
        {"td_error": np.array([1.0, 1.0]), LEARNER_STATS_KEY: {"loss": 1.0}},
        {"td_error": np.array([3.0, 3.0]), LEARNER_STATS_KEY: {"loss": 3.0}},
    )
    np.testing.assert_array_equal(np.asarray(out["td_error"]), [1.0, 1.0, 3.0, 3.0])
    assert out[LEARNER_STATS_KEY] == {"loss": 2.0}


# --------------------------------------------------------------------------- min / max / mean


def test_min_and_max_prefixes():
    out = finalize(
        {"min_q": 3.0, "max_q": 3.0, "q": 3.0},
        {"min_q": -1.0, "max_q": 10.0, "q": -1.0},
        {"min_q": 2.0, "max_q": 4.0, "q": 10.0},
    )
    assert out["min_q"] == -1.0
    assert out["max_q"] == 10.0
    assert out["q"] == pytest.approx(4.0)


def test_prefix_must_be_at_start():
    out = finalize({"q_min_": 1.0, "qmax_x": 1.0}, {"q_min_": 3.0, "qmax_x": 3.0})
    assert out == {"q_min_": 2.0, "qmax_x": 2.0}


def test_min_max_ignore_nan():
    out = finalize({"min_a": math.nan, "max_a": 1.0}, {"min_a": 2.0, "max_a": math.nan}, {"min_a": 5.0, "max_a": 0.0})
    assert out["min_a"] == 2.0
    assert out["max_a"] == 1.0


def test_numbers_nan_mean():
    out = finalize({"loss": 1.0}, {"loss": math.nan}, {"loss": 4.0}, {"loss": 1})
    assert out["loss"] == pytest.approx(2.0)
    assert isinstance(out["loss"], float)


def test_all_nan_is_nan():
    out = finalize({"loss": math.nan, "min_x": math.nan}, {"loss": float("nan"), "min_x": math.nan})
    assert math.isnan(out["loss"])
    assert math.isnan(out["min_x"])


def test_ints_and_bools_averaged():
    out = finalize({"n": 1, "flag": True}, {"n": 2, "flag": False})
    assert out["n"] == pytest.approx(1.5)
    assert out["flag"] == pytest.approx(0.5)


def test_numpy_scalars():
    out = finalize({"loss": np.float32(1.0)}, {"loss": np.float64(2.0)}, {"loss": np.int64(6)})
    assert out["loss"] == pytest.approx(3.0)
    assert isinstance(out["loss"], float)


# --------------------------------------------------------------------------- None / non-numeric


def test_none_stays_none():
    out = finalize({"grad_gnorm": None, "loss": 1.0}, {"grad_gnorm": None, "loss": 3.0})
    assert out["grad_gnorm"] is None
    assert out["loss"] == 2.0


def test_non_numeric_keeps_last_value():
    sentinel = object()
    out = finalize(
        {"phase": "warmup", "obj": object(), "mixed": 1.0},
        {"phase": "train", "obj": sentinel, "mixed": "text"},
    )
    assert out["phase"] == "train"
    assert out["obj"] is sentinel
    assert out["mixed"] == "text"


def test_single_string():
    assert finalize({"name": "ppo"}) == {"name": "ppo"}


# --------------------------------------------------------------------------- nesting


def test_nested_dicts_reduced_leaf_by_leaf():
    out = finalize(
        {
            LEARNER_STATS_KEY: {"loss": 1.0, "min_ratio": 0.9, "max_ratio": 1.1, "kl": torch.tensor(0.25)},
            "custom": {"deep": {"x": 2.0, "tag": "a", "max_y": 1}, "none": None},
            "td_error": np.array([0.1]),
        },
        {
            LEARNER_STATS_KEY: {"loss": 3.0, "min_ratio": 0.8, "max_ratio": 1.3, "kl": torch.tensor(0.75)},
            "custom": {"deep": {"x": 4.0, "tag": "b", "max_y": 7}, "none": None},
            "td_error": np.array([0.2, 0.3]),
        },
    )
    stats = out[LEARNER_STATS_KEY]
    assert stats["loss"] == pytest.approx(2.0)
    assert stats["min_ratio"] == pytest.approx(0.8)
    assert stats["max_ratio"] == pytest.approx(1.3)
    assert stats["kl"] == pytest.approx(0.5)
    assert out["custom"]["deep"] == {"x": pytest.approx(3.0), "tag": "b", "max_y": 7.0}
    assert out["custom"]["none"] is None
    np.testing.assert_allclose(np.asarray(out["td_error"]), [0.1, 0.2, 0.3])


def test_keys_missing_in_some_calls_reduce_over_present_values():
    out = finalize({"a": 1.0}, {"a": 3.0, "b": 10.0}, {"b": 20.0})
    assert out == {"a": pytest.approx(2.0), "b": pytest.approx(15.0)}


# --------------------------------------------------------------------------- multi-policy


def test_multi_agent_results():
    builder = LearnerInfoBuilder()
    builder.add_learn_on_batch_results_multi_agent(
        {
            "p0": {LEARNER_STATS_KEY: {"loss": 1.0}, "td_error": np.array([1.0])},
            "p1": {LEARNER_STATS_KEY: {"loss": 10.0}, "td_error": np.array([5.0, 6.0])},
        }
    )
    builder.add_learn_on_batch_results_multi_agent(
        {
            "p0": {LEARNER_STATS_KEY: {"loss": 3.0}, "td_error": np.array([2.0])},
            "p1": {LEARNER_STATS_KEY: {"loss": 20.0}, "td_error": np.array([7.0])},
        }
    )
    builder.add_learn_on_batch_results({LEARNER_STATS_KEY: {"loss": 5.0}, "td_error": np.array([3.0])}, "p0")
    info = builder.finalize()
    assert set(info) == {"p0", "p1"}
    assert info["p0"][LEARNER_STATS_KEY]["loss"] == pytest.approx(3.0)
    assert info["p1"][LEARNER_STATS_KEY]["loss"] == pytest.approx(15.0)
    np.testing.assert_array_equal(np.asarray(info["p0"]["td_error"]), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(info["p1"]["td_error"]), [5.0, 6.0, 7.0])


def test_empty_builder_finalizes_to_empty():
    assert LearnerInfoBuilder().finalize() == {}


# --------------------------------------------------------------------------- tensors


def test_torch_scalar_tensors_become_python_floats():
    w = torch.tensor(2.0, requires_grad=True)
    out = finalize(
        {"loss": w * 1.0, "min_v": torch.tensor(5.0), "single": torch.tensor(1.5, dtype=torch.float64)},
        {"loss": w * 2.0, "min_v": torch.tensor(-5.0), "single": torch.tensor(2.5, dtype=torch.float64)},
    )
    for key, expected in (("loss", 3.0), ("min_v", -5.0), ("single", 2.0)):
        assert type(out[key]) is float, key
        assert out[key] == pytest.approx(expected)


def test_torch_int_and_nan_scalar_tensors():
    out = finalize({"n": torch.tensor(2)}, {"n": torch.tensor(4)}, {"n": torch.tensor(float("nan"))})
    assert type(out["n"]) is float
    assert out["n"] == pytest.approx(3.0)


def test_results_hold_no_tensors():
    out = finalize({LEARNER_STATS_KEY: {"loss": torch.tensor(1.0, requires_grad=True) + 0}})
    assert not isinstance(out[LEARNER_STATS_KEY]["loss"], torch.Tensor)
    assert out[LEARNER_STATS_KEY]["loss"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- lifecycle


def test_add_after_finalize_raises():
    builder = LearnerInfoBuilder()
    builder.add_learn_on_batch_results({"loss": 1.0})
    builder.finalize()
    with pytest.raises(RuntimeError):
        builder.add_learn_on_batch_results({"loss": 2.0})
    with pytest.raises(RuntimeError):
        builder.add_learn_on_batch_results_multi_agent({"p0": {"loss": 2.0}})


def test_numeric_arrays_of_different_shapes_reduce_over_all_elements():
    b = LearnerInfoBuilder()
    b.add_learn_on_batch_results({"per_row": np.array([1.0, 2.0]), "max_per_row": np.array([1.0, 2.0])})
    b.add_learn_on_batch_results({"per_row": np.array([6.0]), "max_per_row": np.array([0.5])})
    info = b.finalize()["default_policy"]
    assert info["per_row"] == pytest.approx(3.0)
    assert info["max_per_row"] == 2.0


def test_none_among_numbers_is_skipped():
    b = LearnerInfoBuilder()
    for value in (None, 2.0, None, 4.0):
        b.add_learn_on_batch_results({"x": value})
    assert b.finalize()["default_policy"]["x"] == pytest.approx(3.0)
