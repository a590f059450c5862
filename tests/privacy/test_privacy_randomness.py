"""Secret-by-default privacy randomness (fastdpot.privacy.randomness): one wide-tail noise source that every
private path uses, secure vs replayable mode, and no secret in state dicts / checkpoints."""
import io
import math

import numpy as np
import pytest
import torch
from scipy import stats

import fastdpot.ops.flow as flow_op  # noqa: F401  (the op module: its cpu backend reads cpp_status)
from fastdpot.dp_sinkhorn import sanitize_image_gradient
from fastdpot.flows import ClassConditionalFlow, DPSlicedWassersteinFlow
from fastdpot.ops import flow_step
from fastdpot.privacy import (FixedSizeSampler, PoissonSampler, clip_rows, gaussian_local_mechanism,
                              gaussian_projection_mechanism, laplace_local_mechanism)
from fastdpot.privacy.randomness import PrivacyRandomness, privacy_randomness, wide_normal_from_words
from fastdpot._random import random_projections
from fastdpot.sliced import dp_sliced_wasserstein

F32_BOX_MULLER_CAP = math.sqrt(-2.0 * math.log(2.0 ** -24))  # 5.77: float32 torch.randn's largest radius


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------- the source itself
def test_wide_normal_reaches_far_beyond_the_float32_cap():
    w0 = np.zeros(1, dtype=np.uint64)
    z = wide_normal_from_words(w0, w0)  # the smallest radius word: u = 2^-65
    assert z[0] == pytest.approx(math.sqrt(130 * math.log(2)), rel=1e-12) and z[0] > 9.4 > F32_BOX_MULLER_CAP
    # the largest word gives u = 1 (r = 0, finite), never u > 1 or a NaN
    wmax = np.array([2 ** 64 - 1], dtype=np.uint64)
    assert np.all(wide_normal_from_words(wmax, wmax) == 0.0)
    # the angle uses 53 bits: a quarter turn is exactly representable
    quarter = np.array([2 ** 62], dtype=np.uint64)
    zz = wide_normal_from_words(w0, quarter)
    assert abs(zz[0]) < 1e-12 and zz[1] == pytest.approx(z[0], rel=1e-12)


def test_secure_draws_have_the_right_laws():
    src = PrivacyRandomness()
    z = src.normal((200_000,)).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and abs(z.std() - 1) < 0.01
    e = src.exponential((100_000,)).numpy()
    assert stats.kstest(e, "expon").pvalue > 1e-4 and e.min() > 0
    u = src.uniform_int53(100_000)
    assert u.dtype == torch.int64 and int(u.min()) >= 0 and int(u.max()) < 2 ** 53
    assert stats.kstest(u.double().numpy() / 2 ** 53, "uniform").pvalue > 1e-4
    assert src.normal((3, 4), dtype=torch.float32).dtype == torch.float32
    seeds = {src.seed() for _ in range(100)}
    assert len(seeds) == 100 and all(0 <= s < 2 ** 62 for s in seeds)


def test_secure_subset_is_uniform():
    src = PrivacyRandomness()
    n, k, draws = 12, 4, 6000
    counts = np.zeros(n)
    for _ in range(draws):
        idx = src.subset(n, k)
        assert idx.dtype == torch.int64 and len(set(idx.tolist())) == k and 0 <= int(idx.min()) <= int(idx.max()) < n
        counts[idx.numpy()] += 1
    assert stats.chisquare(counts).pvalue > 1e-4
    first = np.bincount([int(src.subset(n, k)[0]) for _ in range(draws)], minlength=n)  # ordered: position 0 uniform
    assert stats.chisquare(first).pvalue > 1e-4
    assert sorted(src.subset(n, n).tolist()) == list(range(n))


def test_secure_samplers():
    s = FixedSizeSampler(50, 7)
    b = s.sample()
    assert len(set(b.tolist())) == 7
    p = PoissonSampler(20_000, 0.1)
    sizes = [p.sample().numel() for _ in range(10)]
    assert abs(np.mean(sizes) - 2000) < 4 * math.sqrt(2000 * 0.9 / 10)
    with pytest.raises(ValueError, match="secure_mode=False"):
        FixedSizeSampler(50, 7, generator=_gen(0))
    with pytest.raises(ValueError, match="secure_mode=False"):
        PoissonSampler(50, 0.1, generator=_gen(0))


def test_replayable_mode_is_the_torch_generator():
    src = PrivacyRandomness(False, _gen(3))
    ref = _gen(3)
    # float64 draws then a cast, even for float32
    assert torch.equal(src.normal((5, 3), dtype=torch.float32), torch.randn(5, 3, generator=ref,
                                                                         dtype=torch.float64).float())
    assert torch.equal(src.subset(10, 4), torch.randperm(10, generator=ref)[:4])
    from fastdpot._random import draw_seed

    assert src.seed() == draw_seed(ref)
    with pytest.raises(ValueError, match="secure mode"):
        PrivacyRandomness(True, _gen(0))
    with pytest.raises(ValueError, match="secure_mode"):
        PrivacyRandomness("yes")
    with pytest.raises(ValueError, match="torch.Generator"):
        privacy_randomness(False, "seed")


# ------------------------------------------------------- every private path draws from the one wide source
PLANTED = 7.0  # beyond the float32 cap: only the wide source can produce it (planted through a spy)


@pytest.fixture
def planted(monkeypatch):
    """Replace the one noise source by a constant PLANTED (> 5.77): a private path that draws its noise elsewhere
    (e.g. float32 torch.randn, capped at 5.77σ) does not show it."""
    calls = []

    def fake_normal(self, shape, dtype=torch.float64, device="cpu"):
        calls.append(tuple(shape))
        return torch.full(tuple(shape), PLANTED, dtype=torch.float64).to(dtype=dtype, device=device)

    monkeypatch.setattr(PrivacyRandomness, "normal", fake_normal)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mechanisms_use_the_wide_source(planted, dtype):
    x = torch.randn(6, 3, generator=_gen(0), dtype=dtype)
    th = random_projections(4, 3, _gen(1), dtype=dtype)
    out = gaussian_projection_mechanism(x, th, 0.5, 1.0)
    torch.testing.assert_close(out - clip_rows(x, 1.0) @ th.T, torch.full_like(out, 0.5 * PLANTED))
    y, sigma = gaussian_local_mechanism(x, 2.0, 1e-5, 1.0)
    torch.testing.assert_close(y - clip_rows(x, 1.0), torch.full_like(y, sigma * PLANTED))
    g = torch.randn(5, 8, generator=_gen(2), dtype=dtype)
    _, s, noise = sanitize_image_gradient(g, 3, 1.0, 2.0, return_noise=True)
    torch.testing.assert_close(noise, torch.full_like(noise, s * PLANTED))
    assert planted  # the spy saw the draws


def test_dp_sliced_wasserstein_reference_noise_is_the_privacy_grade_keyed_stream(planted):
    # the reference backend keys its noise with the release's 62-bit secret key (drawn from the one source) and draws
    # the privacy-grade Philox normals of csrc/sliced.cpp's layout (64-bit radius uniforms: reach 9.49σ,
    # tests/ops/test_flow_step.py::test_privacy_noise_reaches_the_wide_tail)
    from fastdpot.reference.philox import keyed_normals

    x = torch.randn(7, 3, generator=_gen(0), dtype=torch.float64)
    y = torch.randn(5, 3, generator=_gen(1), dtype=torch.float64)
    keys = []
    real_seed = PrivacyRandomness.seed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PrivacyRandomness, "seed", lambda self: keys.append(real_seed(self)) or keys[-1])
        _, nx, ny = dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4, clip_radius=10.0,
                                          backend="reference", return_noise=True)
    assert len(keys) == 1 and keys[0] >= 2 ** 32  # all 62 bits (here: almost surely above 32)
    torch.testing.assert_close(nx, 0.3 * keyed_normals(keys[0], 0, 0, 4 * 7, per_block=2).reshape(4, 7).t())
    torch.testing.assert_close(ny, 0.3 * keyed_normals(keys[0], 1, 0, 4 * 5, per_block=2).reshape(4, 5).t())
    # the directions of a private release come from the source (normalised constants: all entries 1/sqrt(3))
    th = random_projections(4, 3, PrivacyRandomness(), dtype=torch.float32)
    torch.testing.assert_close(th, torch.full_like(th, 1 / math.sqrt(3)))


@pytest.mark.parametrize("quantiles", ["exact", "histogram"])
def test_flow_reference_private_noise_is_the_privacy_grade_keyed_stream(quantiles):
    # private row m on direction j: normal m of stream 2j + 1, two per Philox block (the privacy-grade layout of
    # csrc/flow.cpp); the reference and, where the extension is missing, the "auto" fallback
    from fastdpot.reference.philox import keyed_normals

    x = torch.randn(6, 3, generator=_gen(0), dtype=torch.float64)
    yp = torch.randn(5, 3, generator=_gen(1), dtype=torch.float64)
    th = random_projections(4, 3, _gen(2), dtype=torch.float64)
    kw = dict(noise_std=0.5, step_size=0.1, seed=2 ** 61 + 11, quantiles=quantiles, return_noise=True,
              histogram_bins=8 if quantiles == "histogram" else None)
    _, _, noise = flow_step(x, yp, th, backend="reference", **kw)
    want = 0.5 * keyed_normals(2 ** 61 + 11, [1, 3, 5, 7], 0, 5, per_block=2).t()
    torch.testing.assert_close(noise["private"], want, rtol=0, atol=0)


def test_spy_catches_a_truncated_path(planted):
    """The planted-value check is not vacuous: float32 torch.randn (the old private draw) never shows PLANTED."""
    z = torch.randn(10_000, 4, generator=_gen(0), dtype=torch.float32)
    assert float(z.abs().max()) < F32_BOX_MULLER_CAP < PLANTED


# ----------------------------------------------------------------------------- secure vs replayable outputs
def _flow(secure, seed=0, **kw):
    return DPSlicedWassersteinFlow(8, 3, 3, 0.5, noise_multiplier=1.0, delta=1e-5, batch_size=6, steps=3,
                                   generator=_gen(seed), secure_mode=secure, backend="reference", **kw)


def test_secure_flow_differs_between_runs_replayable_is_identical():
    data = torch.randn(30, 3, generator=_gen(9))
    a, b = _flow(True), _flow(True)
    assert torch.equal(a.particles, b.particles)  # the public start is the seed's
    pa, pb = a.run(data, progress=False), b.run(data, progress=False)
    assert not torch.equal(pa, pb)
    ra, rb = _flow(False), _flow(False)
    assert torch.equal(ra.run(data, progress=False), rb.run(data, progress=False))
    assert a.secure_mode and not ra.secure_mode
    # a non-private flow protects nothing: everything from its generator, replayable
    na = DPSlicedWassersteinFlow(8, 3, 3, 0.5, generator=_gen(0), batch_size=6, steps=3, backend="reference")
    nb = DPSlicedWassersteinFlow(8, 3, 3, 0.5, generator=_gen(0), batch_size=6, steps=3, backend="reference")
    assert not na.secure_mode and torch.equal(na.run(data, progress=False), nb.run(data, progress=False))


def test_secure_class_conditional_and_functions_differ_between_runs():
    data = torch.randn(40, 3, generator=_gen(9))
    labels = torch.arange(40) % 2
    for mode in ("public", "private"):  # per-class flows, and the label-private joint flow
        kw = dict(noise_multiplier=1.0, batch_size=5, steps=2, backend="reference", particles_per_class="equal",
                  num_classes=2, label_privacy=mode)
        out = [ClassConditionalFlow(8, 3, 3, 0.5, generator=_gen(0), secure_mode=s, **kw).run(data, labels,
                                                                                                 progress=False)[0]
               for s in (True, True, False, False)]
        assert not torch.equal(out[0], out[1]) and torch.equal(out[2], out[3])
    x = torch.randn(7, 3, generator=_gen(0))
    y = torch.randn(5, 3, generator=_gen(1))
    once = dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4, clip_radius=1.0)
    assert float(once) != float(dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4,
                                                      clip_radius=1.0))
    assert float(dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4, clip_radius=1.0, secure_mode=False,
                                       generator=_gen(2))) == \
        float(dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4, clip_radius=1.0, secure_mode=False,
                                    generator=_gen(2)))
    assert not torch.equal(laplace_local_mechanism(x, 1.0, 1.0)[0], laplace_local_mechanism(x, 1.0, 1.0)[0])
    with pytest.raises(ValueError, match="secure_mode=False"):
        gaussian_local_mechanism(x, 1.0, 1e-5, 1.0, generator=_gen(0))
    with pytest.raises(ValueError, match="secure_mode=False"):
        dp_sliced_wasserstein(y, private=x, noise_std=0.3, num_projections=4, clip_radius=1.0, generator=_gen(0))


def test_secret_never_in_state_dict_or_checkpoint(monkeypatch, tmp_path):
    seen = []
    real_seed = PrivacyRandomness.seed

    def spy_seed(self):
        s = real_seed(self)
        seen.append(s)
        return s

    monkeypatch.setattr(PrivacyRandomness, "seed", spy_seed)
    f = _flow(True)
    f.run(torch.randn(30, 3, generator=_gen(9)), progress=False, checkpoint_path=str(tmp_path / "c.pt"))
    assert len(seen) == 3
    blob = (tmp_path / "c.pt").read_bytes()
    buf = io.BytesIO()
    torch.save(f.state_dict(), buf)
    for s in seen:  # neither the 8 bytes of a step's key nor its decimal form is stored
        for b in (blob, buf.getvalue()):
            assert s.to_bytes(8, "little") not in b and str(s).encode() not in b
    st = f.state_dict()
    assert st["secure_mode"] is True
    # the stored generator state is the public one: restoring it replays only the public start
    g = torch.Generator()
    g.set_state(st["generator"])
    assert torch.equal(g.get_state(), _flow(True).state_dict()["generator"])
    # resuming keeps secure mode
    assert DPSlicedWassersteinFlow.load(str(tmp_path / "c.pt"), backend="reference").secure_mode


def test_trainers_secure_by_default_replayable_on_request():
    from fastdpot.dp_sinkhorn import DPSinkhornConfig, train_dp_sinkhorn
    from fastdpot.dpswgen import train_dpswgen
    from fastdpot.experiments.papers.dp_sinkhorn import ConditionalDCGANGenerator
    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    x = torch.randn(60, 4, generator=_gen(0))

    def swgen(secure):
        torch.manual_seed(0)  # parameter initialisation (public)
        # ε = inf keeps the test fast (no calibration); batches and directions still come from the source
        res = train_dpswgen(x, MLPGenerator(2, 4), math.inf, 1e-5, steps=2, batch_size=10, num_projections=5,
                            generator=_gen(1), secure_mode=secure, backend="reference")
        return torch.cat([p.detach().flatten() for p in res.generator.parameters()])

    assert not torch.equal(swgen(True), swgen(True)) and torch.equal(swgen(False), swgen(False))
    imgs = torch.rand(40, 1, 28, 28, generator=_gen(2))
    labels = torch.arange(40) % 10

    def sink(secure):
        cfg = DPSinkhornConfig(expected_batch_size=8, generated_batch_size=8, noise_multiplier=5.0, max_steps=1,
                               ratio=0.25, accountant="rdp", blur=2.0, secure_mode=secure)
        torch.manual_seed(0)  # parameter initialisation (public)
        res = train_dp_sinkhorn(imgs, labels, ConditionalDCGANGenerator(4, 10, 4), cfg)
        assert len(res.released_norms) == res.steps == 1
        return torch.tensor(res.released_norms)

    assert not torch.equal(sink(True), sink(True)) and torch.equal(sink(False), sink(False))
