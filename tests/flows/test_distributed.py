"""Sharded flows (fastdpot.distributed) on gloo/CPU: processes spawned inside pytest, a FileStore rendezvous.

Sharding invariance (same particles for world size 1, 2, 3, uneven shards), one release and one accounting event
per step (ε identical across world sizes and equal to the single-process flow's), the histogram phases against the
single-process reference, checkpoint / kill / resume, and the errors every rank must raise together."""
import datetime
import math
import multiprocessing as mp
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist

from fastdpot.flows import ClassConditionalFlow, DistributedSlicedWassersteinFlow, DPSlicedWassersteinFlow

_BASE = dict(num_particles=11, dim=3, num_projections=4, step_size=0.5, diffusion=0.01, noise_multiplier=1.5,
             delta=1e-5, batch_size=6, steps=6, quantiles="histogram", histogram_bins=8, secure_mode=False)


def _data():
    return torch.randn(40, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 0.7 + 0.3


def _worker(rank, world, store, out, scenario, arg, timeout_s):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        res = _SCENARIOS[scenario](rank, world, arg)
        torch.save(dict(ok=True, res=res), os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        torch.save(dict(ok=False, type=type(e).__name__, msg=str(e), tb=traceback.format_exc()),
                   os.path.join(out, f"rank{rank}.pt"))


def _spawn(tmp_path, world, scenario, arg=None, timeout_s=180, wait_s=600):
    # generous limits: on a loaded machine the data rank's one-off work (noise calibration, ε) can take a while
    out = tmp_path / f"{scenario}-{world}-{time.monotonic_ns()}"
    out.mkdir()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, str(out / "store"), str(out), scenario, arg, timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(wait_s)
        if p.is_alive():
            p.kill()
    got = []
    for r in range(world):
        f = out / f"rank{r}.pt"
        got.append(torch.load(f, weights_only=False) if f.exists() else None)
    return got


@pytest.fixture
def world1(tmp_path):
    """A gloo group of world size 1 in the pytest process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store1'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _flow(group=None, **kw):
    cfg = dict(_BASE, **kw)
    return DistributedSlicedWassersteinFlow(**cfg, generator=torch.Generator().manual_seed(3),
                                            process_group=dist.group.WORLD if group is None else group)


_CONFIGS = (("hist", {}), ("exact", dict(quantiles="exact", histogram_bins=None, diffusion=0.0)),
            ("sketch", dict(release="sketch", sketch_bins=3, init="sphere")))


def _class_conditional(rank, group):
    kw = dict(_BASE)
    for key in ("num_particles", "dim", "num_projections", "step_size", "secure_mode"):
        kw.pop(key)
    ccf = ClassConditionalFlow(11, 3, 4, 0.5, generator=torch.Generator().manual_seed(4), secure_mode=False,
                               label_privacy="public", process_group=dist.group.WORLD if group is None else group, **kw)
    x = _data()
    y = (x[:, 0] > 0.3).long()
    local, local_y = ccf.run(x if rank == 0 else None, y if rank == 0 else None, progress=False)
    full, full_y = ccf.gather_samples()
    return dict(full=full, labels=full_y, local=local, eps=ccf.epsilon(), steps=6, shard=(0, 11),
                sizes=[f.config.num_particles for f in ccf.flows])


def _run_configs(rank, group, names):
    res = {}
    if "cc" in names:
        res["cc"] = _class_conditional(rank, group)
    for name, kw in _CONFIGS:
        if name in names:
            f = _flow(group, **kw)
            f.run(_data() if rank == 0 else None, progress=False)
            res[name] = dict(full=f.gather_particles(), local=f.particles.clone(), shard=f.shard, eps=f.epsilon(),
                             steps=f.steps_taken, last_run=f.last_run)
    return res


def _scn_invariance(rank, world, names):
    if world == 2:  # record every tensor this rank receives or reduces (what a rank learns)
        log = []
        for op in ("broadcast", "all_reduce", "all_gather"):
            def wrap(fn, op=op):
                def inner(t, *a, **kw):
                    log.append((op, tuple((t[0] if isinstance(t, list) else t).shape),
                                str((t[0] if isinstance(t, list) else t).dtype)))
                    return fn(t, *a, **kw)
                return inner
            setattr(dist, op, wrap(getattr(dist, op)))
        f = _flow()
        f.run(_data() if rank == 0 else None, progress=False)
        first = len(log)
        f.run(None if rank else _data(), steps=0, progress=False)
        return {"log": log[:first], "steps": f.steps_taken, world: _run_configs(rank, None, names)}
    out = {world: _run_configs(rank, None, names)}
    if world == 3:  # world size 2 as a subgroup of the same processes (saves a spawn)
        sub = dist.new_group([0, 1])
        if rank < 2:
            out[2] = _run_configs(rank, sub, names)
    return out


def _scn_ckpt(rank, world, arg):
    """arg = (mode, folder): "full" runs T steps checkpointing every 2; "kill" (rank 1 dies after step 3) and
    "hang" (rank 1 sleeps past the group timeout) must make rank 0 raise RankFailureError; "resume" loads the
    folder and finishes; "resume_cfg" resumes with another step size (must fail on every rank)."""
    from fastdpot.flows.sharded import RankFailureError

    mode, folder = arg
    f = _flow(step_size=0.4) if mode == "resume_cfg" else _flow()
    data = _data() if rank == 0 else None
    if mode.startswith("resume"):
        try:
            at = f.load_checkpoint(folder)
        except ValueError as e:
            return dict(error=str(e), steps=f.steps_taken)
        assert at == 2 and f.steps_taken == 2
    cb = None
    if mode in ("kill", "hang") and rank == 1:
        def cb(fl):
            if fl.steps_taken == 3:
                if mode == "kill":
                    os._exit(3)
                time.sleep(12)
    try:
        f.run(data, steps=4 if mode == "short" else None, progress=False, checkpoint_path=folder, checkpoint_every=2,
              callback=cb)
    except RankFailureError as e:
        return dict(failure=str(e), steps=f.steps_taken)
    return dict(full=f.gather_particles(), eps=f.epsilon(), steps=f.steps_taken)


def _scn_pipeline(rank, world, arg):
    """The main job's flow stage sharded as `fastdpot flow --distributed` runs it: rank 0 runs generate_flow on the
    codes, the other ranks follow."""
    from fastdpot.experiments.mainjob import MainJobConfig
    from fastdpot.experiments.mainjob import distributed
    from fastdpot.experiments.mainjob.generation import generate_flow

    distributed.register_pipeline_group(dist.group.WORLD, wait_s=60)
    if rank != 0:
        return dict(followed=distributed.pipeline_follow())
    cfg = MainJobConfig(quick=True, epsilon=10.0, replayable_noise=True).with_settings(
        dataset="digits", num_particles=20, latent_dim=4, labels="public").resolved()  # per-class flows
    g = torch.Generator().manual_seed(0)
    lat = torch.randn(300, 4, generator=g)
    lat = lat / lat.norm(dim=1, keepdim=True)
    labels = torch.randint(0, 3, (300,), generator=g)
    try:
        res = generate_flow(cfg, lat, labels, 20, cfg.seed + 1, progress=False)
    finally:
        distributed.pipeline_done()
    return dict(samples=res["samples"], labels=res["sample_labels"], eps=res["epsilon"],
                taken=[f["steps_taken"] for f in res["privacy"]["flows"]], planned=res["privacy"]["steps"],
                sizes=[f["num_particles"] for f in res["privacy"]["flows"]])


_SCENARIOS = {"invariance": _scn_invariance, "ckpt": _scn_ckpt, "pipeline": _scn_pipeline}


def _ok(got):
    for r, g in enumerate(got):
        assert g is not None, f"rank {r} wrote nothing"
        assert g["ok"], f"rank {r}: {g['type']}: {g['msg']}\n{g['tb']}"
    return [g["res"] for g in got]


def _check_invariance(one, runs, names):
    ref = DPSlicedWassersteinFlow(**dict(_BASE, quantiles="exact", histogram_bins=None),
                                  generator=torch.Generator().manual_seed(3))
    ref.run(_data(), progress=False)  # the single-process flow: same event (q = 6/40, z = 1.5), same T
    for name in names:
        if name == "cc":  # class-conditional: the class flows' sizes and samples do not depend on the sharding
            for w, per_rank in runs.items():
                for got in per_rank:
                    assert got["cc"]["sizes"] == one["cc"]["sizes"] and sum(one["cc"]["sizes"]) == 11
                    assert torch.equal(got["cc"]["labels"], one["cc"]["labels"])
                    torch.testing.assert_close(got["cc"]["full"], one["cc"]["full"], rtol=1e-4, atol=1e-5)
                    assert got["cc"]["eps"] == one["cc"]["eps"] > 0
            continue
        assert one[name]["steps"] == 6 and one[name]["shard"] == (0, 11)
        assert one[name]["eps"] == ref.epsilon() and 0 < one[name]["eps"] < math.inf
        for w, per_rank in runs.items():
            spans = []
            for got in per_rank:
                got = got[name]
                assert got["steps"] == 6 and got["eps"] == one[name]["eps"]  # one accounting event per step
                # every rank reports its run like the one-process flow: stop reason, steps, ε
                assert got["last_run"] == one[name]["last_run"] == type(ref.last_run)(6, 6, 6, "completed", ref.epsilon())
                torch.testing.assert_close(got["full"], one[name]["full"], rtol=1e-4, atol=1e-5)
                a, b = got["shard"]
                spans.append(b - a)
                assert torch.equal(got["local"], got["full"][a:b])
            assert sum(spans) == 11 and max(spans) - min(spans) <= 1 and len(spans) == w
    assert not torch.allclose(one[names[0]]["full"], one[names[1]]["full"], atol=1e-3)  # the configs differ


def test_sharding_invariance_world_1_and_2(tmp_path, world1):
    names = ("hist", "exact")  # the slow test adds the sketch release and world size 3
    one = _run_configs(0, None, names)
    got = _ok(_spawn(tmp_path, 2, "invariance", names))
    _check_invariance(one, {2: [r[2] for r in got]}, names)
    # what the non-data rank received over one run of 6 steps: per step the go code, the header, the (k, d) = (4, 3)
    # directions, the (k, B) = (4, 6) release and its levels (never a (B, d) block of rows), then 2k extremes, the
    # (k, bins) counts and two flags; nothing scales with N
    step = [("broadcast", (1,), "torch.int64"), ("broadcast", (5,), "torch.int64"),
            ("broadcast", (4, 3), "torch.float64"), ("broadcast", (4, 6), "torch.float64"),
            ("broadcast", (6,), "torch.float64"),
            ("all_reduce", (8,), "torch.float64"), ("all_reduce", (4, 8), "torch.int64"),
            ("all_reduce", (1,), "torch.float64"), ("all_reduce", (1,), "torch.float64")]
    log = got[1]["log"]
    assert log[:-1] == step * 6
    assert log[-1] == ("broadcast", (1,), "torch.float64")  # ε at the end of the run
    assert got[1]["steps"] == 6
    from bench.distributed import bytes_per_step

    msgs, _ = bytes_per_step(4, 3, 6, 8, 2)
    assert sum(msgs.values()) == sum(math.prod(sh) * 8 for _, sh, _ in step)


@pytest.mark.slow
def test_sharding_invariance_world_3_and_subgroup_2(tmp_path, world1):
    names = ("hist", "exact", "sketch", "cc")
    one = _run_configs(0, None, names)
    got = _ok(_spawn(tmp_path, 3, "invariance", names))
    _check_invariance(one, {3: [r[3] for r in got], 2: [r[2] for r in got[:2]]}, names)


def test_make_flow_picks_the_sharded_flow_for_a_process_group(world1):
    from fastdpot.flows import make_flow

    one = make_flow(11, 3, 4, 0.5)
    assert type(one) is DPSlicedWassersteinFlow
    sharded = make_flow(**_BASE, process_group=dist.group.WORLD, generator=torch.Generator().manual_seed(3))
    assert type(sharded) is DistributedSlicedWassersteinFlow and sharded.shard == (0, 11)
    with pytest.raises(TypeError, match="process_group"):
        DPSlicedWassersteinFlow(11, 3, 4, 0.5, process_group=dist.group.WORLD)  # no class switching: refused
    sharded.run(_data(), steps=7, progress=False)  # T = 6 planned: the sharded run says why it stopped
    assert sharded.last_run.stop_reason == "planned_steps" and sharded.steps_taken == 6


def test_shard_range():
    from fastdpot.flows import shard_range

    for n, w in ((11, 3), (12, 3), (5, 5), (100, 7)):
        rng = [shard_range(n, w, r) for r in range(w)]
        assert rng[0][0] == 0 and rng[-1][1] == n
        assert all(rng[i][1] == rng[i + 1][0] for i in range(w - 1))
        sz = [b - a for a, b in rng]
        assert max(sz) - min(sz) <= 1
    with pytest.raises(ValueError, match="world size"):
        shard_range(2, 3, 0)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_world_size_1_sharded_step_is_the_op_step_with_the_release_as_a_table(world1, backend):
    # the sharded flow's step is op flow_step on its rows: with one rank, the release (broadcast as a table at the
    # levels m/(B-1)) and the keyed draws of the step reproduce the op's reference on the whole array
    from fastdpot.ops import flow_step

    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(13, 3, generator=g, dtype=torch.float64)
    f = DistributedSlicedWassersteinFlow(13, 3, 4, 0.7, diffusion=0.05, quantiles="histogram", histogram_bins=6,
                                         noise_multiplier=1.0, batch_size=9, steps=2, init=x0, secure_mode=False,
                                         generator=torch.Generator().manual_seed(5), process_group=dist.group.WORLD,
                                         backend=backend)
    seen = []
    real = f._exchange
    f._exchange = lambda release: seen.append(real(release)) or seen[-1]
    f.run(torch.randn(30, 3, generator=g, dtype=torch.float64), steps=1, progress=False)
    rel = seen[0]
    want, _, _ = flow_step(x0, None, rel["projections"], noise_std=rel["noise_std"], seed=rel["seed"],
                           sketch=rel["sketch"], step_size=0.7, diffusion=0.05, quantiles="histogram",
                           histogram_bins=6, backend="reference")
    # the C++ passes draw the same keyed normals in single precision (~2e-6 of σ apart)
    tol = 1e-9 if backend == "reference" else 1e-5 * rel["noise_std"]
    torch.testing.assert_close(f.particles, want, rtol=0, atol=tol)
    assert rel["sketch"][0].shape == (4, 9) and torch.equal(rel["sketch"][1], torch.linspace(0, 1, 9).double())
    assert rel["noise_std"] == f.noise_std > 0 and f.steps_taken == 1


def test_bad_arguments_of_a_sharded_flow(world1):
    with pytest.raises(ValueError, match="grid"):
        _flow(quantiles="grid", num_quantiles=5, histogram_bins=None)
    with pytest.raises(ValueError, match="resample"):
        _flow(variant="presampled")
    with pytest.raises(ValueError, match="data_rank"):
        DistributedSlicedWassersteinFlow(**_BASE, process_group=dist.group.WORLD, data_rank=1)
    with pytest.raises(ValueError, match="histogram"):
        _flow(quantiles="exact", histogram_bins=None, exact_gather_limit=10)
    with pytest.raises(ValueError, match="takes no shard"):
        _flow(backend="triton")
    f = _flow()
    with pytest.raises(ValueError, match="private_data"):
        f.run(torch.randn(5, 4), progress=False)
    assert f.steps_taken == 0 and f.epsilon() == 0.0
    with pytest.raises(TypeError, match="load_checkpoint"):
        type(f).load("anything.pt")
    with pytest.raises(ValueError, match="does not exist"):
        f.load_checkpoint(os.path.join(os.path.dirname(__file__), "no_such_folder"))


@pytest.mark.slow
def test_kill_a_rank_then_resume_to_the_same_particles_and_epsilon(tmp_path):
    full = _ok(_spawn(tmp_path, 2, "ckpt", ("full", str(tmp_path / "full"))))
    ck = str(tmp_path / "ck")
    killed = _spawn(tmp_path, 2, "ckpt", ("kill", ck), timeout_s=10)
    assert killed[1] is None  # rank 1 died without a word
    assert killed[0]["ok"] and "failure" in killed[0]["res"] and killed[0]["res"]["steps"] in (3, 4)
    names = sorted(os.listdir(ck))
    assert names == ["main.pt", "shard-00000-of-00002-step000000002.pt", "shard-00001-of-00002-step000000002.pt"]
    assert torch.load(os.path.join(ck, "main.pt"), weights_only=False)["step"] == 2
    # a world size or a config other than the checkpoint's: a clear error on every rank, nothing released
    for w, mode, what in ((3, "resume", "world size"), (2, "resume_cfg", "config")):
        bad = _ok(_spawn(tmp_path, w, "ckpt", (mode, ck)))
        assert all(what in r["error"] and r["steps"] == 0 for r in bad)
    assert torch.load(os.path.join(ck, "main.pt"), weights_only=False)["step"] == 2
    resumed = _ok(_spawn(tmp_path, 2, "ckpt", ("resume", ck)))
    # the step-2 checkpoint left releases 3-4 in flight (checkpoint_every=2): the resumed run counts them as spent
    # (they were released before the kill) and takes its planned T = 6 releases by step 4, with the replayed draws
    short = _ok(_spawn(tmp_path, 2, "ckpt", ("short", str(tmp_path / "short"))))
    for r in range(2):
        assert resumed[r]["steps"] == 4, resumed[r]
        torch.testing.assert_close(resumed[r]["full"], short[r]["full"], rtol=0, atol=0)
        assert resumed[r]["eps"] == full[r]["eps"] > 0


@pytest.mark.slow
def test_a_hanging_rank_is_detected_by_the_group_timeout(tmp_path):
    ck = str(tmp_path / "hang")
    t0 = time.monotonic()
    got = _spawn(tmp_path, 2, "ckpt", ("hang", ck), timeout_s=4)
    assert got[0]["ok"] and "failure" in got[0]["res"], got[0]
    assert time.monotonic() - t0 < 60
    assert torch.load(os.path.join(ck, "main.pt"), weights_only=False)["step"] == 2


def test_class_conditional_flow_on_one_rank(world1):
    res = _class_conditional(0, None)
    assert res["full"].shape == (11, 3) and torch.equal(res["full"], res["local"])
    assert res["labels"].tolist() == sorted(res["labels"].tolist()) and set(res["labels"].tolist()) == {0, 1}
    assert 0 < res["eps"] < math.inf


@pytest.mark.slow
def test_the_pipeline_flow_stage_sharded_over_two_ranks(tmp_path):
    r0, r1 = _ok(_spawn(tmp_path, 2, "pipeline"))
    assert r1["followed"] == 1
    assert r0["samples"].shape == (20, 4) and torch.isfinite(r0["samples"]).all()
    assert sorted(set(r0["labels"].tolist())) == [0, 1, 2] and sum(r0["sizes"]) == 20
    assert all(t == r0["planned"] for t in r0["taken"]) and 0 < r0["eps"] <= 10.0 + 1e-9


def test_secure_mode_sharded_flow_runs_and_accounts(world1):
    f = DistributedSlicedWassersteinFlow(**dict(_BASE, secure_mode=True), process_group=dist.group.WORLD)
    assert f.secure_mode and f._rng.secure_mode  # the data rank's privacy draws come from the operating system
    f.run(_data(), steps=2, progress=False)
    assert f.steps_taken == 2 and torch.isfinite(f.particles).all() and 0 < f.epsilon() < math.inf
