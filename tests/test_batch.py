"""Oracle tests for SampleBatch / MultiAgentBatch (docs/design.md, "Core contracts")."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch


def make_batch(n: int = 10) -> SampleBatch:
    """Rows are identifiable: obs row i is [i, 10 i, 100 i], rewards i / 2, actions i."""
    ids = torch.arange(n)
    return SampleBatch(
        {
            SampleBatch.OBS: torch.stack([ids, 10 * ids, 100 * ids], dim=1).float(),
            SampleBatch.ACTIONS: ids.clone(),
            SampleBatch.REWARDS: ids.double() / 2,
            SampleBatch.TERMINATEDS: ids % 3 == 0,
        }
    )


def assert_rows(batch: SampleBatch, rows: list[int]) -> None:
    """``batch`` holds exactly rows ``rows`` of ``make_batch`` in that order, all columns aligned."""
    ids = torch.tensor(rows, dtype=torch.long)
    assert batch.count == len(rows)
    torch.testing.assert_close(batch[SampleBatch.ACTIONS], ids)
    torch.testing.assert_close(batch[SampleBatch.OBS], torch.stack([ids, 10 * ids, 100 * ids], dim=1).float())
    torch.testing.assert_close(batch[SampleBatch.REWARDS], ids.double() / 2)
    torch.testing.assert_close(batch[SampleBatch.TERMINATEDS], ids % 3 == 0)


# --------------------------------------------------------------------------- basics


def test_column_access_and_count():
    b = make_batch(7)
    assert b.count == 7
    assert len(b) == 7
    assert b.num_columns() == 4
    assert set(b.keys()) == {"obs", "actions", "rewards", "terminateds"}
    assert b["obs"].shape == (7, 3)
    torch.testing.assert_close(b[SampleBatch.ACTIONS], torch.arange(7))


def test_non_tensor_values_become_tensors():
    b = SampleBatch(rewards=[1.0, 2.0, 3.0], actions=np.array([0, 1, 2]))
    assert isinstance(b["rewards"], torch.Tensor)
    assert isinstance(b["actions"], torch.Tensor)
    assert b.count == 3
    b["weights"] = [0.5, 0.5, 0.5]
    assert isinstance(b["weights"], torch.Tensor)
    torch.testing.assert_close(b["weights"], torch.tensor([0.5, 0.5, 0.5]))


def test_count_ignores_seq_lens_column():
    b = SampleBatch({SampleBatch.SEQ_LENS: torch.tensor([2, 3]), "obs": torch.zeros(5, 2)})
    assert b.count == 5
    assert SampleBatch().count == 0


# --------------------------------------------------------------------------- select


def test_select_slice():
    b = make_batch(10)
    assert_rows(b[2:6], [2, 3, 4, 5])
    assert_rows(b.select(slice(0, 10, 3)), [0, 3, 6, 9])
    assert_rows(b[8:100], [8, 9])


def test_select_bool_mask():
    b = make_batch(6)
    mask = torch.tensor([True, False, True, True, False, False])
    assert_rows(b[mask], [0, 2, 3])
    np_mask = np.array([False, True, False, False, False, True])
    assert_rows(b[np_mask], [1, 5])


def test_select_int_tensor_and_numpy_and_list():
    b = make_batch(10)
    assert_rows(b[torch.tensor([7, 1, 1, 4])], [7, 1, 1, 4])
    assert_rows(b[np.array([9, 0, 3])], [9, 0, 3])
    assert_rows(b[[5, 2]], [5, 2])


def test_select_returns_new_batch():
    b = make_batch(5)
    sub = b[torch.tensor([0, 1])]
    assert isinstance(sub, SampleBatch)
    sub["extra"] = torch.zeros(2)
    assert "extra" not in b
    assert b.count == 5


# --------------------------------------------------------------------------- concat


def test_concat_samples():
    b = make_batch(10)
    cat = SampleBatch.concat_samples([b[0:3], b[3:4], b[4:10]])
    assert_rows(cat, list(range(10)))
    assert_rows(b[5:7].concat(b[0:2]), [5, 6, 0, 1])


def test_concat_samples_column_order_does_not_matter():
    a = SampleBatch({"x": torch.tensor([1.0]), "y": torch.tensor([2.0])})
    b = SampleBatch({"y": torch.tensor([4.0]), "x": torch.tensor([3.0])})
    cat = SampleBatch.concat_samples([a, b])
    torch.testing.assert_close(cat["x"], torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(cat["y"], torch.tensor([2.0, 4.0]))


def test_concat_samples_column_mismatch_raises():
    a = SampleBatch({"x": torch.zeros(2), "y": torch.zeros(2)})
    b = SampleBatch({"x": torch.zeros(3)})
    with pytest.raises(ValueError):
        SampleBatch.concat_samples([a, b])
    with pytest.raises(ValueError):
        SampleBatch.concat_samples([b, a])


def test_concat_samples_empty_list():
    assert SampleBatch.concat_samples([]).count == 0


# --------------------------------------------------------------------------- shuffle


def _row_ids(batch: SampleBatch) -> list[int]:
    return batch[SampleBatch.ACTIONS].tolist()


def test_shuffle_seeded_is_reproducible_and_aligned():
    b = make_batch(50)
    s1 = b.shuffle(torch.Generator().manual_seed(123))
    s2 = b.shuffle(torch.Generator().manual_seed(123))
    s3 = b.shuffle(torch.Generator().manual_seed(456))
    order = _row_ids(s1)
    assert order == _row_ids(s2)
    assert order != _row_ids(s3)
    assert order != list(range(50))  # actually permuted
    assert sorted(order) == list(range(50))  # a permutation
    assert_rows(s1, order)  # every column moved with its row
    assert_rows(s3, _row_ids(s3))
    assert_rows(b, list(range(50)))  # the original is untouched


def test_shuffle_with_seq_lens_keeps_sequences_whole():
    b = make_batch(10)
    b[SampleBatch.SEQ_LENS] = torch.tensor([3, 1, 4, 2])
    seqs = [[0, 1, 2], [3], [4, 5, 6, 7], [8, 9]]
    s = b.shuffle(torch.Generator().manual_seed(0))
    order = _row_ids(s)
    assert_rows(s, order)
    # cut the shuffled rows by the shuffled seq_lens: each piece is an original sequence
    pieces, start = [], 0
    for n in s[SampleBatch.SEQ_LENS].tolist():
        pieces.append(order[start : start + n])
        start += n
    assert start == 10
    assert sorted(pieces) == sorted(seqs)
    s2 = b.shuffle(torch.Generator().manual_seed(0))
    assert _row_ids(s2) == order


# --------------------------------------------------------------------------- minibatches


@pytest.mark.parametrize(("n", "size"), [(10, 3), (12, 4), (5, 5), (5, 8), (1, 1)])
def test_minibatches_cover_every_row_once(n, size):
    b = make_batch(n)
    mbs = list(b.minibatches(size, generator=torch.Generator().manual_seed(7)))
    expected_sizes = [size] * (n // size) + ([n % size] if n % size else [])
    assert [mb.count for mb in mbs] == expected_sizes
    seen = []
    for mb in mbs:
        ids = _row_ids(mb)
        assert_rows(mb, ids)
        seen.extend(ids)
    assert sorted(seen) == list(range(n))


def test_minibatches_seeded_and_shuffled():
    b = make_batch(20)
    first = [_row_ids(mb) for mb in b.minibatches(6, generator=torch.Generator().manual_seed(1))]
    again = [_row_ids(mb) for mb in b.minibatches(6, generator=torch.Generator().manual_seed(1))]
    assert first == again
    assert [i for mb in first for i in mb] != list(range(20))


def test_minibatches_without_shuffle_in_order():
    b = make_batch(7)
    mbs = [_row_ids(mb) for mb in b.minibatches(3, shuffle=False)]
    assert mbs == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("size", [0, -2])
def test_minibatches_nonpositive_size_raises(size):
    with pytest.raises(ValueError):
        list(make_batch(4).minibatches(size))


SEQ_LENS = [3, 1, 4, 2, 5, 2, 1, 3, 3]  # 24 rows


def _seq_batch() -> tuple[SampleBatch, list[list[int]]]:
    b = make_batch(sum(SEQ_LENS))
    b[SampleBatch.SEQ_LENS] = torch.tensor(SEQ_LENS)
    seqs, start = [], 0
    for n in SEQ_LENS:
        seqs.append(list(range(start, start + n)))
        start += n
    return b, seqs


@pytest.mark.parametrize("size", [5, 6, 8, 24, 100])
@pytest.mark.parametrize("shuffle", [True, False])
def test_sequence_minibatches_never_split_sequences(size, shuffle):
    b, seqs = _seq_batch()
    mbs = list(b.minibatches(size, generator=torch.Generator().manual_seed(3), shuffle=shuffle))
    pieces, seen = [], []
    for mb in mbs:
        ids = _row_ids(mb)
        assert_rows(mb, ids)
        mb_lens = mb[SampleBatch.SEQ_LENS].tolist()
        assert sum(mb_lens) == mb.count
        assert mb.count <= size  # every sequence here is at most 5 <= size
        start = 0
        for n in mb_lens:
            pieces.append(ids[start : start + n])
            start += n
        seen.extend(ids)
    assert sorted(seen) == list(range(sum(SEQ_LENS)))
    assert sorted(pieces) == sorted(seqs)
    # greedy packing: the next minibatch's first sequence would not have fit
    for mb, nxt in itertools.pairwise(mbs):
        assert mb.count + int(nxt[SampleBatch.SEQ_LENS][0]) > size


def test_sequence_minibatches_unshuffled_packing():
    b, _ = _seq_batch()
    lens = [mb[SampleBatch.SEQ_LENS].tolist() for mb in b.minibatches(6, shuffle=False)]
    # [3,1] (+4 > 6), [4,2], [5] (+2 > 6), [2,1,3], [3]
    assert lens == [[3, 1], [4, 2], [5], [2, 1, 3], [3]]


def test_sequence_longer_than_minibatch_is_kept_whole():
    b = make_batch(9)
    b[SampleBatch.SEQ_LENS] = torch.tensor([2, 6, 1])
    mbs = list(b.minibatches(4, shuffle=False))
    assert [_row_ids(mb) for mb in mbs] == [[0, 1], [2, 3, 4, 5, 6, 7], [8]]
    assert [mb[SampleBatch.SEQ_LENS].tolist() for mb in mbs] == [[2], [6], [1]]


# --------------------------------------------------------------------------- device


def test_to_device_copies_all_columns():
    b = make_batch(4)
    b[SampleBatch.SEQ_LENS] = torch.tensor([1, 3])
    moved = b.to("cpu")
    assert isinstance(moved, SampleBatch)
    assert set(moved.keys()) == set(b.keys())
    for k in b:
        assert moved[k].device == torch.device("cpu")
        torch.testing.assert_close(moved[k], b[k])
    moved = b.to(torch.device("meta"))
    assert set(moved.keys()) == set(b.keys())
    assert all(v.device.type == "meta" for v in moved.values())
    assert moved.count == 4
    assert all(v.device.type == "cpu" for v in b.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda_round_trip():
    b = make_batch(4)
    on_gpu = b.to("cuda")
    assert all(v.is_cuda for v in on_gpu.values())
    assert_rows(on_gpu.to("cpu"), [0, 1, 2, 3])


# --------------------------------------------------------------------------- multi-agent


def test_as_multi_agent():
    b = make_batch(6)
    ma = b.as_multi_agent()
    assert isinstance(ma, MultiAgentBatch)
    assert DEFAULT_POLICY_ID == "default_policy"
    assert list(ma.policy_batches) == ["default_policy"]
    assert ma.policy_batches["default_policy"] is b
    assert ma.env_steps == 6
    assert ma.count == 6
    assert ma.agent_steps() == 6
    assert ma.as_multi_agent() is ma
    assert ma.info == {}


def test_multi_agent_batch_agent_steps_and_to_keeps_info():
    p0, p1 = make_batch(5), make_batch(3)
    info = {"episode_returns": [1.0, 2.5], "sample_time": 0.1}
    ma = MultiAgentBatch({"p0": p0, "p1": p1}, env_steps=5, info=info)
    assert ma.env_steps == 5
    assert ma.count == 5
    assert ma.agent_steps() == 8
    moved = ma.to("meta")
    assert isinstance(moved, MultiAgentBatch)
    assert moved.env_steps == 5
    assert moved.agent_steps() == 8
    assert moved.info == info
    assert set(moved.policy_batches) == {"p0", "p1"}
    for pid in ("p0", "p1"):
        assert all(v.device.type == "meta" for v in moved.policy_batches[pid].values())
    cpu = ma.to("cpu")
    assert_rows(cpu.policy_batches["p0"], list(range(5)))
    assert_rows(cpu.policy_batches["p1"], list(range(3)))
    assert cpu.info == info
