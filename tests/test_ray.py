"""Sampler workers as Ray actors (``sampler_backend="ray"``, data/workers/ray_actors.py).

One Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``: a head and a second
node of 4 logical CPUs, each with one ``sampler_slot``; the second also has 2 ``cpu_node``) serves the module; the
test process joins it explicitly, so no other Ray on the machine is ever joined, and every Ray
process it started is gone after the module. Fits that start their own local Ray (the default
without an address), and DDP and Ray Train runs, run in subprocesses (tests/ray_worker.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch

from lightning_rl import A3C, APEX, APPO, IMPALA
from lightning_rl.data.learner_queue import POLICY_VERSION
from tests.conftest import ddp_subprocess_env, default_sigint, quiet_trainer, ray_temp_dir
from tests.image_envs import BrightSide, stacked_bright_side
from tests.ray_worker import descendants
from tests.test_env_faults import live_pids

pytestmark = pytest.mark.timeout(300)
WORKER = Path(__file__).with_name("ray_worker.py")
MB = 1024 ** 2
SMALL = dict(env="CartPole-v1", num_workers=2, num_envs=2, rollout_fragment_length=10, hiddens=(16,), seed=0,
             sampler_backend="ray", sampler_timeout_s=60.0)


@pytest.fixture(scope="module")
def cluster():
    """A head node and a second node on this machine, this process connected; all stopped after."""
    from ray.cluster_utils import Cluster

    before = set(descendants(os.getpid()))
    with ray_temp_dir() as temp:  # Cluster writes its address file there and does not create it
        nodes = None
        try:
            nodes = Cluster(initialize_head=True, connect=False, head_node_args=dict(
                num_cpus=4, resources={"sampler_slot": 1}, object_store_memory=100 * MB, include_dashboard=False,
                temp_dir=str(temp)))
            second = nodes.add_node(num_cpus=4, resources={"sampler_slot": 1, "cpu_node": 2},
                                    object_store_memory=100 * MB)
            ray.init(address=nodes.address, log_to_driver=False)
            yield SimpleNamespace(nodes=nodes, head=nodes.head_node.node_id, second=second.node_id)
        finally:
            ray.shutdown()
            if nodes is not None:
                nodes.shutdown()
    started = set(descendants(os.getpid())) - before
    assert not live_pids(sorted(started), grace_s=10.0), "Ray processes outlived the module"


def actor_pids(dm) -> list[int]:
    return [w["pid"] for w in dm.pool.where if w is not None]


def started(model):
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    return dm


# ------------------------------------------------------------------ settings, no Ray needed
def test_ray_settings_need_the_ray_backend_and_ray_names_its_extra(monkeypatch):
    with pytest.raises(ValueError, match="ray_address, custom_resources_per_worker apply to Ray actors"):
        IMPALA(ray_address="ray://head:10001", custom_resources_per_worker={"cpu_node": 1})
    with pytest.raises(ValueError, match=r"sampler_backend must be one of \('processes', 'ray'\), got 'threads'"):
        APEX(sampler_backend="threads")
    import lightning_rl.data.workers.ray_actors as ray_actors

    monkeypatch.setattr(ray_actors, "ray_installed", lambda: False)
    with pytest.raises(ImportError, match=r"^sampler_backend='ray' needs Ray: pip install 'lightning-rl\[ray\]'$"):
        A3C(sampler_backend="ray")
    A3C(sampler_backend="ray", num_workers=0)  # no workers, no Ray


# ------------------------------------------------------------------ on the module's cluster
def test_a_ray_actor_samples_exactly_what_a_worker_process_samples(cluster):
    """Same seed, same weights: the first fragment of a Ray actor equals a worker process's, to
    the bit; uint8 frames arrive as uint8."""
    settings = dict(env=BrightSide, vectorization="sync", num_workers=1, num_envs=2, rollout_fragment_length=8,
                    train_batch_size=16, hiddens=(), vf_share_layers=True, seed=3, sampler_timeout_s=60.0)
    batches = {}
    for backend in ("processes", "ray"):
        dm = started(IMPALA(**settings, sampler_backend=backend))
        try:
            batches[backend] = dm.sample().policy_batches["default_policy"]
        finally:
            dm.close()
    processes, actors = batches["processes"], batches["ray"]
    assert actors["obs"].dtype == actors["bootstrap_obs"].dtype == torch.uint8
    assert actors["obs"].shape == (8, 2, 16, 16, 1) and actors["valid"].dtype == torch.bool
    assert set(processes) == set(actors)
    for key in processes:
        assert torch.equal(processes[key], actors[key]), key


def test_apex_packets_of_frames_arrive_through_ray_as_from_a_process(cluster):
    """APEX on frame stacks: the worker's packet of distinct frames and indices, from a Ray actor,
    fills the learner's packed replay exactly as the same worker's packet from a process does."""
    settings = dict(env=stacked_bright_side, num_workers=1, num_envs=2, rollout_fragment_length=8, hiddens=(16,),
                    seed=3, learning_starts=0, sampler_timeout_s=60.0)
    states = {}
    for backend in ("processes", "ray"):
        dm = started(APEX(**settings, sampler_backend=backend))
        try:
            dm.sample()
            assert dm.frame_stack is True
            states[backend] = dm.buffer.state_dict()
        finally:
            dm.close()
    processes, actors = states["processes"], states["ray"]
    assert processes["frames_added"] == actors["frames_added"] > 0 and processes["num_added"] > 0
    assert actors["frames"].dtype == np.uint8
    for key, value in processes.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, actors[key]), key


class Versions:
    """The policy versions and per-worker env steps of every batch trained on."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.steps: dict[str, float] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.versions.append(int(batch.policy_batches["default_policy"][POLICY_VERSION].max()))
        self.steps = {k: v for k, v in batch.info["perf"].items() if k.startswith("worker_")}


def test_impala_actors_spread_over_both_nodes_and_both_feed_the_learner(cluster):
    """One ``sampler_slot`` per node and per actor: one actor on each node. Fragments from both
    are trained on, the broadcast weights reach them (the last batch was sampled with weights of
    a later iteration than the first), and no actor outlives fit."""
    import pytorch_lightning as pl

    seen = Versions()
    callback = type("Seen", (pl.Callback,), {"on_train_batch_start": seen.on_train_batch_start})()
    # a short learner queue: 16 fragments (the default) sampled before the first broadcast, on a
    # loaded machine, could be all the 24 a 12-iteration run trains on
    model = IMPALA(**SMALL, train_batch_size=40, total_env_steps=40 * 12, learner_queue_size=2,
                   custom_resources_per_worker={"sampler_slot": 1})
    quiet_trainer(max_epochs=-1, callbacks=[callback]).fit(model)
    dm = model.default_datamodule
    assert {w["node_id"] for w in dm.pool.where} == {cluster.head, cluster.second}
    assert model.counters["num_env_steps_sampled"] == 40 * 12
    assert seen.steps["worker_0_env_steps_per_s"] > 0 and seen.steps["worker_1_env_steps_per_s"] > 0
    assert seen.versions[0] == 0 and seen.versions[-1] >= 1  # later fragments sampled with broadcast weights
    assert not live_pids(actor_pids(dm), grace_s=10.0)


@pytest.mark.parametrize("algo", ["APPO", "APEX", "A3C"])
def test_appo_apex_and_a3c_run_on_actors_pinned_to_the_cpu_node(algo, cluster):
    settings = {
        "APPO": dict(train_batch_size=40, total_env_steps=40 * 6),
        "APEX": dict(learning_starts=40, num_gradient_steps=2, train_batch_size=16, total_env_steps=40 * 6),
        "A3C": dict(total_env_steps=20 * 8),
    }[algo]
    model = {"APPO": APPO, "APEX": APEX, "A3C": A3C}[algo](**SMALL, custom_resources_per_worker={"cpu_node": 1},
                                                           **settings)
    quiet_trainer(max_epochs=-1).fit(model)
    dm = model.default_datamodule
    assert [w["node_id"] for w in dm.pool.where] == [cluster.second] * 2
    budget = settings["total_env_steps"]
    # (A3C's last iteration may apply the other worker's packet, already there, too: 20 env steps)
    assert budget <= model.counters["num_env_steps_sampled"] <= budget + (20 if algo == "A3C" else 0)
    assert model.counters["num_grad_updates"] > 0
    assert not live_pids(actor_pids(dm), grace_s=10.0)


class FailsInActor(BrightSide):
    def step(self, action):
        if self._t == 5:
            raise ValueError("the simulator diverged at step 5")
        return super().step(action)


def test_an_env_error_in_an_actor_is_raised_with_its_traceback(cluster):
    model = IMPALA(**{**SMALL, "env": FailsInActor, "hiddens": (), "vectorization": "sync"}, train_batch_size=40)
    with pytest.raises(RuntimeError, match=r"(?s)sampler worker \d \(Ray actor \w+, pid \d+, on node \w+ at .*"
                                           r"Traceback in the worker.*the simulator diverged at step 5"):
        quiet_trainer(max_epochs=1, limit_train_batches=3).fit(model)
    assert not live_pids(actor_pids(model.default_datamodule), grace_s=10.0)


def test_a_killed_actor_is_named_with_its_node_or_restarted_with_a_new_seed(cluster):
    one = {**SMALL, "num_workers": 1}  # one actor each: start-up is most of the time here
    dm = started(IMPALA(**one, train_batch_size=20))
    try:
        dm.sample()
        victim = dm.pool.where[0]
        os.kill(victim["pid"], signal.SIGKILL)  # as the OOM killer would
        died = (rf"sampler worker 0 \(Ray actor {victim['actor_id']}, pid {victim['pid']}, on node "
                rf"{victim['node_id']} at [\d.]+\) died: .*")
        with pytest.raises(RuntimeError, match=died):
            for _ in range(50):
                dm.sample()
    finally:
        dm.close()

    model = IMPALA(**one, train_batch_size=20, restart_failed_workers=True)
    dm = started(model)
    try:
        dm.sample()
        old = dm.pool.where[0]
        os.kill(old["pid"], signal.SIGKILL)
        for _ in range(8):
            dm.sample()
        assert dm.counters["num_worker_restarts"] == 1 and dm.pool.restarts == [1]
        new = dm.pool.locate(0, timeout=30)
        assert new["pid"] != old["pid"] and new["actor_id"] != old["actor_id"]
        assert dm._worker_seed(0, 1) != dm._worker_seed(0, 0)  # the new actor's envs: new seeds
    finally:
        dm.close()
    assert not live_pids(actor_pids(dm), grace_s=10.0)


def test_losing_a_node_names_the_worker_and_the_lost_node(cluster):
    doomed = cluster.nodes.add_node(num_cpus=2, resources={"doomed": 2}, object_store_memory=100 * MB)
    dm = started(IMPALA(**SMALL, train_batch_size=40, custom_resources_per_worker={"doomed": 1}))
    try:
        dm.sample()
        assert {w["node_id"] for w in dm.pool.where} == {doomed.node_id}
        cluster.nodes.remove_node(doomed)
        with pytest.raises(RuntimeError, match=rf"(?s)sampler worker \d \(Ray actor \w+, pid \d+, on node "
                                               rf"{doomed.node_id} at [\d.]+\) died: .*its node has died"):
            for _ in range(50):
                dm.sample()
    finally:
        dm.close()


def test_an_actor_no_node_can_place_is_an_error_within_sampler_timeout_s(cluster):
    start = time.monotonic()
    model = IMPALA(**{**SMALL, "sampler_timeout_s": 2.0}, train_batch_size=40,
                   custom_resources_per_worker={"gpu_node": 1})
    with pytest.raises(RuntimeError, match=r"sampler worker 0: its Ray actor was not placed within "
                                           r"sampler_timeout_s=2 s: no node has num_cpus=1 and resources "
                                           r"\{'gpu_node': 1\} free"):
        started(model)
    assert time.monotonic() - start < 30


def run_worker(mode: str, out: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**ddp_subprocess_env(PL_DISABLE_FORK="1"), "PYTHONPATH": str(WORKER.parents[1])}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, str(WORKER), mode, str(out), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_ddp_ranks_drive_their_own_actors(cluster, tmp_path):
    """2-rank DDP, each rank joining the cluster (``ray_address``): its own two actors, its own
    seeds, the same parameters after every step."""
    proc = run_worker("ddp", tmp_path, cluster.nodes.address)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["params"] == r1["params"]
    assert not {w["pid"] for w in r0["where"]} & {w["pid"] for w in r1["where"]}
    assert r0["first_obs"] != r1["first_obs"]
    assert r0["global_counters"]["num_env_steps_sampled"] == 2 * 40 * 4


def test_the_whole_fit_under_ray_train(cluster, tmp_path):
    """The documented recipe (docs/guides/scaling-out.md, tagged ``ray_train``), on CPU ranks:
    Ray Train's ``TorchTrainer`` runs the learner ranks (Lightning DDP through
    ``ray.train.lightning``), and each rank's sampler actors join the same cluster."""
    proc = run_worker("ray_train", tmp_path, cluster.nodes.address, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["params"] == r1["params"] and r0["global_counters"]["num_env_steps_sampled"] == 2 * 40 * 4
    assert not {w["pid"] for w in r0["where"]} & {w["pid"] for w in r1["where"]}


# ------------------------------------------------------------------ a local Ray of its own
def pids_of(lines: list[str], prefix: str) -> list[int]:
    found = [line.split()[2:] if prefix == "CLEAN" else line.split()[1:] for line in lines if line.startswith(prefix)]
    return [int(p) for p in found[-1]] if found else []


def test_a_local_ray_is_started_for_the_run_and_nothing_outlives_fit_or_an_error(tmp_path):
    """Without a Ray or an address, fit starts a local Ray and shuts it down: after a fit that
    finishes and after one whose env raises, none of its processes (raylet, GCS, actors) live."""
    proc = run_worker("finish", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    clean = {line.split()[1]: [int(p) for p in line.split()[2:]] for line in lines if line.startswith("CLEAN")}
    assert set(clean) == {"fit", "raises"} and len(clean["fit"]) >= 3  # GCS, raylet, 2 actors at least
    assert any(line.startswith("ERROR sampler worker") for line in lines)
    assert not live_pids(clean["fit"] + clean["raises"], grace_s=10.0)


def test_ctrl_c_stops_the_fit_and_its_local_ray(tmp_path):
    proc = subprocess.Popen([sys.executable, str(WORKER), "sigint", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(WORKER.parents[1]), "OMP_NUM_THREADS": "1"},
                            preexec_fn=default_sigint)  # Ctrl-C at its default, as from a terminal
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ITERATION 3"):
                break
        ray_pids = pids_of(lines, "RAY")
        assert ray_pids, "".join(lines[-50:])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
    assert "ITERATION 6000" not in rest  # stopped, not run to its budget
    assert not live_pids(ray_pids, grace_s=10.0)


def test_resume_with_ray_actors_keeps_counters_weights_and_replay(cluster, tmp_path):
    """As with worker processes (tests/test_async_resume.py): the counters, weights, optimizer and
    replay continue from the checkpoint; the actors start fresh episodes; none outlives either fit."""
    def apex() -> APEX:
        return APEX(env="CartPole-v1", num_workers=2, num_envs=2, rollout_fragment_length=8, hiddens=(16,),
                    learning_starts=32, num_gradient_steps=2, train_batch_size=16, target_network_update_freq=64,
                    buffer_size=500, seed=0, total_env_steps=None, iterations_per_epoch=4, sampler_backend="ray",
                    sampler_timeout_s=120.0)

    first = apex()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=4, default_root_dir=tmp_path)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    weights = [p.detach().clone() for p in first.parameters()]
    resumed = apex()
    quiet_trainer(max_epochs=2, limit_train_batches=4, default_root_dir=tmp_path).fit(resumed,
                                                                                      ckpt_path=tmp_path / "mid.ckpt")
    assert first.counters["num_iterations"] == 4 and resumed.counters["num_iterations"] == 8
    assert resumed.counters["num_env_steps_sampled"] == 8 * 2 * 2 * 8  # iterations x workers x envs x steps
    assert resumed.counters["num_grad_updates"] == 2 * first.counters["num_grad_updates"] > 0
    assert resumed.default_datamodule.buffer.num_added > first.default_datamodule.buffer.num_added > 0
    assert any(not torch.equal(a, b) for a, b in zip(weights, resumed.parameters()))  # trained on from there
    for model in (first, resumed):
        assert not live_pids(actor_pids(model.default_datamodule), grace_s=10.0)


def test_the_cluster_needs_nothing_an_earlier_ray_left_and_leaves_nothing(tmp_path):
    """On a machine where no Ray ever ran (a TMPDIR with no ``ray/`` in it, a HOME of its own) the
    module's cluster starts, serves a test and is gone, leaving that TMPDIR as empty as it found it."""
    fresh_tmp, fresh_home = tmp_path / "t", tmp_path / "h"
    fresh_tmp.mkdir()
    fresh_home.mkdir()
    env = {**os.environ, "TMPDIR": str(fresh_tmp), "HOME": str(fresh_home), "PYTHONPATH": str(WORKER.parents[1])}
    env.pop("RAY_TMPDIR", None)
    first = f"{Path(__file__)}::test_a_ray_actor_samples_exactly_what_a_worker_process_samples"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", first, "-n", "0", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'base'}"],
        env=env, cwd=WORKER.parents[1], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
    assert sorted(p.name for p in fresh_tmp.iterdir()) == []


# ------------------------------------------------------------------ issue 35: a fragment lost after it was ready
class LosesFragments:
    """The ``ray`` module as the pool sees it, except that fetching the next fragments raises
    these errors: what Ray raises when a ready fragment's copy was lost with its node
    (``ObjectLostError``) or its owner's record of it is gone (``OwnerDiedError``)."""

    def __init__(self, pool, errors: list[type]) -> None:
        self._pool, self._errors = pool, list(errors)

    def __getattr__(self, name: str):
        return getattr(ray, name)

    def get(self, ref, *args, **kwargs):
        if self._errors and isinstance(ref, ray.ObjectRef) and ref not in self._pool.where_refs:
            raise self._errors.pop(0)(ref.hex(), None, "")
        return ray.get(ref, *args, **kwargs)


def test_a_fragment_lost_after_it_was_ready_is_a_dead_worker(cluster):
    """A lost fragment (its node gone after it was ready) ends the worker as a death does: a new
    actor with a new seed under ``restart_failed_workers``, else an error naming the worker."""
    from ray.exceptions import ObjectLostError, OwnerDiedError

    one = {**SMALL, "num_workers": 1}
    dm = started(IMPALA(**one, train_batch_size=20, restart_failed_workers=True))
    try:
        dm.sample()
        old = dm.pool.where[0]
        dm.pool.ray = LosesFragments(dm.pool, [ObjectLostError, OwnerDiedError])
        for _ in range(6):
            dm.sample()
        assert dm.counters["num_worker_restarts"] == 2 and dm.pool.restarts == [2]
        assert not dm.pool.ray._errors
        assert dm.pool.locate(0, timeout=30)["actor_id"] != old["actor_id"]
        assert not live_pids([old["pid"]], grace_s=10.0)  # the old actor was killed
    finally:
        dm.close()
    assert not live_pids(actor_pids(dm), grace_s=10.0)

    dm = started(IMPALA(**one, train_batch_size=20))
    try:
        dm.sample()
        dm.pool.ray = LosesFragments(dm.pool, [ObjectLostError])
        with pytest.raises(RuntimeError, match=r"sampler worker 0 \(Ray actor \w+, pid \d+, on node \w+ at [\d.]+\) "
                                               r"lost its fragment: .*"):
            for _ in range(50):
                dm.sample()
    finally:
        dm.close()
    assert not live_pids(actor_pids(dm), grace_s=10.0)
