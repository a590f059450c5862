"""Fast direction blocks (fastdpot.flows.directions: PatchDCTBlock, RandomHadamardBlock, DenseBlock): the operators
against their materialised Θ (Kronecker products of scipy-checked DCT matrices; scipy's Hadamard matrices), in both
dtypes and both particle layouts; the fused block step of op flow_step against the dense step and the reference; the
one-shot release through fast blocks against the release through the dense Θ; bad blocks refused before any draw."""
import math

import pytest
import torch

from fastdpot._ext import cpp_status
from fastdpot.flows.directions import (DEFAULT_PATCHES, DenseBlock, PatchDCTBlock, RandomHadamardBlock,
                                       default_patches, hadamard_blocks, image_blocks, patch_block, patch_dct_blocks)
from fastdpot.ops import flow_step
from fastdpot.privacy.class_sketch import class_quantile_sketch
from fastdpot.privacy.randomness import PrivacyRandomness

needs_cpp = pytest.mark.skipif(not cpp_status("flow_block")[0], reason="needs the C++ extension _C_flow_block")

# every patch size of the default plans (28 x 28, and a 16 x 16 colour image), shifted grids, partial patches
SHAPES = ([(28, 28, 1, p, (sy, sx)) for p, sy, sx in DEFAULT_PATCHES]
          + [(16, 16, 3, p, (sy, sx)) for p, sy, sx in default_patches(16, 16)]
          + [(10, 13, 3, 4, (1, 2)), (9, 7, 1, 5, (2, 0)), (28, 28, 1, 7, (3, 3))])


def _reference(H, W, C, p, shift):
    """Θ by Kronecker products (the dense construction; independent of the C++ transform)."""
    return patch_block(H, W, p, shift, C)[0]


@needs_cpp
@pytest.mark.parametrize("H,W,C,p,shift", SHAPES)
def test_patch_dct_block_is_its_materialised_basis(H, W, C, p, shift):
    block = PatchDCTBlock(H, W, p, shift, C)
    th = _reference(H, W, C, p, shift)
    torch.testing.assert_close(block.matrix(), th, rtol=0, atol=1e-14)
    g = torch.Generator().manual_seed(p)
    x = torch.randn(37, C * H * W, generator=g, dtype=torch.float64)  # 37: not a multiple of any tile
    y = torch.randn(37, C * H * W, generator=g, dtype=torch.float64)
    # float64: a sum of at most 2p + C products per value in each direction; float32: ~2p roundings of ~|x| (1e-7)
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 4e-6 * (p + C))):
        for layout in ("rows", "columns"):
            xs, ys = x.to(dt), y.to(dt)
            if layout == "columns":  # a flow's particles kept transposed
                xs, ys = xs.t().contiguous().t(), ys.t().contiguous().t()
            torch.testing.assert_close(block.forward(xs).double(), x @ th.t(), rtol=0, atol=tol * 8)
            torch.testing.assert_close(block.transpose(ys).double(), y @ th, rtol=0, atol=tol * 8)


@needs_cpp
def test_a_truncated_block_keeps_the_lowest_frequencies_in_image_blocks_order():
    block = PatchDCTBlock(16, 16, 8, (4, 4), 3, per_block=300)
    th, f = image_blocks(16, 16, 3, patches=((8, 4, 4),), per_block=300)
    torch.testing.assert_close(block.matrix(), th, rtol=0, atol=1e-14)
    torch.testing.assert_close(block.frequency, f)
    x = torch.randn(20, 768, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(block.forward(x), x @ th.t(), rtol=0, atol=1e-12)
    torch.testing.assert_close(block.transpose(block.forward(x)), x @ th.t() @ th, rtol=0, atol=1e-12)
    blocks = patch_dct_blocks(28, 28)
    assert [(b.patch, b.shift) for b in blocks] == [(p, (sy, sx)) for p, sy, sx in DEFAULT_PATCHES]
    dense, freq = image_blocks(28, 28)
    torch.testing.assert_close(torch.cat([b.matrix() for b in blocks]), dense, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([b.frequency for b in blocks]), freq, rtol=0, atol=0)


@pytest.mark.parametrize("D", [1, 12, 100, 784])
def test_random_hadamard_block_is_a_product_of_scipy_hadamard_factors(D):
    from scipy.linalg import hadamard

    block = RandomHadamardBlock(D, seed=7)
    th = block.matrix()
    torch.testing.assert_close(th @ th.t(), torch.eye(D, dtype=torch.float64), rtol=0, atol=1e-12)
    # the same matrix built here from scipy's Hadamard matrices and the block's public permutations and signs
    wht = torch.zeros(D, D, dtype=torch.float64)
    for a, s in block._pieces:
        wht[a:a + s, a:a + s] = torch.from_numpy(hadamard(s).astype("float64")) / math.sqrt(s)
    want = torch.eye(D, dtype=torch.float64)
    for r in range(block.rounds):
        signed_permutation = torch.eye(D, dtype=torch.float64)[block._perm[r]] * block._sign[r][:, None]
        want = wht @ signed_permutation @ want
    torch.testing.assert_close(th, want, rtol=0, atol=1e-12)
    x = torch.randn(21, D, dtype=torch.float64, generator=torch.Generator().manual_seed(D))
    torch.testing.assert_close(block.forward(x), x @ want.t(), rtol=0, atol=1e-12)
    torch.testing.assert_close(block.transpose(x), x @ want, rtol=0, atol=1e-12)
    assert torch.equal(RandomHadamardBlock(D, seed=7).matrix(), th)  # public seed: the same block
    if D > 1:
        assert not torch.equal(RandomHadamardBlock(D, seed=8).matrix(), th)
    assert [b.seed for b in hadamard_blocks(D, 3, seed=5)] == [5, 6, 7]


def test_dense_block_checks_its_rows_and_falls_back_without_a_kernel():
    q = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    block = DenseBlock(q[:4])
    x = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(block.forward(x), x @ q[:4].t())
    assert block.shape == (4, 6) and not block.frequency.any()
    with pytest.raises(ValueError, match="orthonormal"):
        DenseBlock(q[:4] * 1.01)
    with pytest.raises(ValueError, match="at most D rows"):
        DenseBlock(torch.cat([q, q[:1]]))


class _NoDraw(PrivacyRandomness):
    """Privacy randomness that fails the test on any draw: every refusal below comes before the noise."""

    def normal(self, *a, **k):
        raise AssertionError("noise drawn before the input was refused")


class _Mis(PatchDCTBlock):
    """A patch-DCT block whose transform has the wrong normalisation (every DCT matrix 1 % too large)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._spec = dict(self._spec, dct=self._spec["dct"] * 1.01)

    def check_orthonormal(self, *a, **k):  # a block that lies about itself: the release calls the base check
        return self


@needs_cpp
def test_bad_blocks_are_refused_before_any_release():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 64, generator=g, dtype=torch.float64)
    y = torch.arange(40) % 2
    kw = dict(num_classes=2, sketch_bins=2, noise_multiplier=1.0, clip_radius=3.0, generator=_NoDraw(True))
    with pytest.raises(ValueError, match="not orthonormal"):
        class_quantile_sketch(x, y, [_Mis(8, 8, 4)], **kw)
    with pytest.raises(ValueError, match="not orthonormal"):
        PatchDCTBlock.check_orthonormal(_Mis(8, 8, 4))
    with pytest.raises(ValueError, match="blocks of R\\^64"):  # a channel count that does not match the rows
        class_quantile_sketch(x, y, [PatchDCTBlock(8, 8, 4, channels=3)], **kw)
    with pytest.raises(ValueError, match="one size and dimension"):
        class_quantile_sketch(x, y, [PatchDCTBlock(8, 8, 4), PatchDCTBlock(8, 8, 4, per_block=10)], **kw)
    with pytest.raises(ValueError, match="block_size"):
        class_quantile_sketch(x, y, [PatchDCTBlock(8, 8, 4)], block_size=64, **kw)
    with pytest.raises(TypeError, match="DirectionBlock"):
        class_quantile_sketch(x, y, [PatchDCTBlock(8, 8, 4), "dct"], **kw)
    with pytest.raises(ValueError, match="at most the image side"):
        PatchDCTBlock(8, 8, 9)
    with pytest.raises(ValueError, match="shift"):
        PatchDCTBlock(8, 8, 4, shift=(1,))
    tampered = PatchDCTBlock(8, 8, 4)
    tampered._spec = dict(tampered._spec, rows=tampered._spec["rows"][:1])  # bands that do not tile the image
    with pytest.raises(ValueError, match="cover the image side"):
        tampered.forward(x)
    with pytest.raises(ValueError, match=r"\(N, 64\)"):
        PatchDCTBlock(8, 8, 4).forward(x[:, :10])


def _table(p, L, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.sort(torch.randn(p, L, generator=g, dtype=torch.float64), 1).values,
            (torch.arange(L, dtype=torch.float64) + 0.5) / L)


@needs_cpp
@pytest.mark.parametrize("block", [PatchDCTBlock(12, 12, 5, (3, 3)), PatchDCTBlock(7, 9, 4, (1, 2), 3, 100),
                                   RandomHadamardBlock(100, 5)], ids=["dct", "dct-colour-truncated", "hadamard"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("diffusion", [0.0, 0.3])
def test_the_fused_block_step_is_the_dense_step_and_the_reference(block, dtype, diffusion):
    N, D, p = 203, block.dim, block.size  # N: a multiple of nothing
    x64 = torch.rand(N, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    table, levels = _table(p, 5, 3)
    lo = torch.full((D,), 0.1, dtype=torch.float64)
    lo[::3] = -1.0  # a box that differs by coordinate
    kw = dict(noise_std=0.0, step_size=0.7 * p, sketch=(table, levels), diffusion=diffusion, seed=11,
              domain=(lo, 0.9))
    want, want_drift, _ = flow_step(x64, None, block.matrix(), backend="reference", **kw)
    assert float(want.min()) >= -1.0 and float(want.max()) <= 0.9
    th = block.matrix(dtype)
    dense, dense_drift, _ = flow_step(x64.to(dtype), None, th, backend="cpu", **kw)
    # float64: rounding, and the Brownian normals of the fast single-precision Box-Muller (~2e-6 of each, times
    # sqrt(2λh)); float32: besides, rank swaps of projections within float32's spacing move one residual by the
    # table's slope over one rank, times α (0.7), plus d-term sums of float32 products
    slope = float(((table[:, 1:] - table[:, :-1]) / (levels[1:] - levels[:-1])).abs().max())
    brown = 4e-6 * math.sqrt(2 * diffusion * 0.7 * p)
    tol = (1e-10 + brown) if dtype == torch.float64 else 0.7 * slope / (N - 1) + 1e-4 + brown
    for layout in ("rows", "columns"):
        x = x64.to(dtype)
        if layout == "columns":
            x = x.t().contiguous().t()
        got, drift, noise = flow_step(x, None, block, backend="cpu", **kw)
        assert noise is None and got.dtype == dtype and got.shape == (N, D)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)
        torch.testing.assert_close(got.double(), dense.double(), rtol=0, atol=tol)
        torch.testing.assert_close(drift.double(), want_drift, rtol=0, atol=tol / (0.7 * p) + 1e-6)
        ref, _, _ = flow_step(x, None, block, backend="reference", **kw)  # the reference row takes a block too
        torch.testing.assert_close(ref.double(), want, rtol=0, atol=tol)
        lean, no_drift, _ = flow_step(x, None, block, backend="cpu", return_drift=False, **kw)
        assert no_drift is None and torch.equal(lean, got)  # the same step, no drift formed


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("N", [2816, 2803])  # whole 64-byte tiles in every row; rows that start off that grid
def test_a_large_steps_streamed_output_is_the_cached_one(dtype, N):
    # from 8 MB of new particles on, the fused step in a flow's layout writes them past the caches (non-temporal
    # stores, csrc/block_transforms.h stream_lanes) where a row's tile is 64-byte aligned, plainly elsewhere: the same
    # values as the particle-major layout's plain stores, and into an output whose rows are all off the grid
    block = PatchDCTBlock(28, 28, 7)
    D = block.dim
    assert N * D * 4 >= 8 << 20
    x = torch.rand(D, N, generator=torch.Generator().manual_seed(5), dtype=dtype).t()  # coordinate-major
    table, levels = _table(D, 5, 3)
    kw = dict(noise_std=0.0, step_size=0.7 * D, sketch=(table, levels), domain=(0.0, 1.0), return_drift=False,
              backend="cpu")
    rows, _, _ = flow_step(x.contiguous(), None, block, **kw)
    cols, _, _ = flow_step(x, None, block, **kw)
    assert torch.equal(rows, cols) and float(cols.min()) >= 0.0 and float(cols.max()) <= 1.0
    buf = torch.full((D * N + 1,), 5.0, dtype=dtype)
    off, _, _ = flow_step(x, None, block, out=buf[1:].view(D, N).t(), **kw)
    assert torch.equal(off, cols) and float(buf[0]) == 5.0


@needs_cpp
def test_a_step_whose_projections_are_streamed_is_the_dense_step():
    # from 256 MB of projections on, pass a writes them past the caches (csrc/flow_block.cpp): 86 016 particles of
    # 28 x 28 (270 MB of float32 projections) give the dense step's result within float32's rounding
    block = PatchDCTBlock(28, 28, 7)
    N, D = 86_016, block.dim
    assert N * D * 4 >= 256 << 20
    x = torch.rand(D, N, generator=torch.Generator().manual_seed(6)).t()
    table, levels = _table(D, 5, 3)
    kw = dict(noise_std=0.0, step_size=0.7 * D, sketch=(table, levels), domain=(0.0, 1.0), return_drift=False,
              backend="cpu")
    got, _, _ = flow_step(x, None, block, **kw)
    dense, _, _ = flow_step(x, None, block.matrix(torch.float32), **kw)
    slope = float(((table[:, 1:] - table[:, :-1]) / (levels[1:] - levels[:-1])).abs().max())
    torch.testing.assert_close(got, dense, rtol=0, atol=0.7 * slope / (N - 1) + 1e-4)


@needs_cpp
def test_blocks_in_other_modes_run_materialised_and_gpu_rows_refuse_them():
    from fastdpot._ext import BackendUnavailableError

    block = PatchDCTBlock(6, 6, 3)
    x = torch.rand(50, 36, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.rand(40, 36, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(noise_std=0.2, step_size=1.0, seed=4, quantiles="histogram", histogram_bins=8, domain=(0.0, 1.0))
    a, _, _ = flow_step(x, y, block, backend="cpu", **kw)
    b, _, _ = flow_step(x, y, block.matrix(), backend="cpu", **kw)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    with pytest.raises(BackendUnavailableError, match="direction block"):
        flow_step(x, y, block, backend="triton", **kw)
    with pytest.raises(ValueError, match="domain"):
        flow_step(x, y, block, backend="cpu", **dict(kw, domain=(1.0, 0.0)))
    with pytest.raises(ValueError, match="domain"):
        flow_step(x, y, block, backend="cpu", **dict(kw, domain=(torch.zeros(3), 1.0)))


@needs_cpp
@pytest.mark.parametrize("kind", ["dct", "hadamard"])
def test_the_release_through_fast_blocks_is_the_release_through_the_dense_directions(kind):
    H = W = 8
    blocks = (patch_dct_blocks(H, W, 3, patches=((8, 0, 0), (4, 2, 2), (3, 1, 0))) if kind == "dct"
              else hadamard_blocks(3 * H * W, 3, seed=1))
    th = torch.cat([b.matrix() for b in blocks])
    g = torch.Generator().manual_seed(0)
    x = torch.rand(301, 3 * H * W, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (301,), generator=g)
    bins = torch.randint(1, 6, (th.shape[0],), generator=g)
    kw = dict(num_classes=3, sketch_bins=bins, noise_multiplier=0.7, clip_radius=2.0, secure_mode=False,
              centers=torch.full((3 * H * W,), 0.5, dtype=torch.float64))
    fast = class_quantile_sketch(x, y, blocks, generator=torch.Generator().manual_seed(9), **kw)
    dense = class_quantile_sketch(x, y, th, block_size=3 * H * W, generator=torch.Generator().manual_seed(9), **kw)
    assert fast.sensitivity == dense.sensitivity and fast.noise_std == dense.noise_std
    torch.testing.assert_close(fast.counts, dense.counts, rtol=0, atol=0)
    # the same noise; the sums differ by the projections' float64 rounding (a few ulps of ~r per row)
    torch.testing.assert_close(fast.sums, dense.sums, rtol=0, atol=1e-11)
    torch.testing.assert_close(fast.projections, th, rtol=0, atol=1e-14)
    assert fast.num_blocks == 3 and fast.block_size == 3 * H * W


@needs_cpp
def test_the_oneshot_generation_on_fast_blocks_gives_the_dense_blocks_samples():
    from fastdpot.flows import ReleasedClassFlows

    blocks = patch_dct_blocks(8, 8, 1, patches=((8, 0, 0), (4, 0, 0), (4, 2, 2), (2, 1, 1)))
    dense = [DenseBlock(b.matrix(), frequency=b.frequency) for b in blocks]  # the same bands to pool over
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 64, generator=g, dtype=torch.float64)
    y = torch.arange(400) % 3
    kw = dict(num_classes=3, sketch_bins=4, noise_multiplier=0.5, clip_radius=3.0, secure_mode=False,
              centers=torch.full((64,), 0.5, dtype=torch.float64))
    rels = [class_quantile_sketch(x, y, b, generator=torch.Generator().manual_seed(3), **kw) for b in (blocks, dense)]
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, None)):
        out = [ReleasedClassFlows(r, particles_per_class=[301, 200, 157], domain=(0.0, 1.0), dtype=dtype,
                                  generator=torch.Generator().manual_seed(1)).run(steps=8) for r in rels]
        assert torch.equal(out[0][1], out[1][1])
        if tol is not None:  # float64: the same steps up to rounding (no rank of a float64 projection ties)
            torch.testing.assert_close(out[0][0], out[1][0], rtol=0, atol=tol)
        else:  # float32: rank swaps of projections within float32's spacing (the two paths round the projections
            # differently) move a particle by one rank's target, and later steps carry it on: a few particles move
            # visibly, the set hardly at all (pixels in [0, 1])
            diff = (out[0][0] - out[1][0]).abs()
            assert float(diff.mean()) < 3e-3 and float(diff.median()) < 1e-5


@needs_cpp
@pytest.mark.parametrize("fused", [True, False], ids=["fused-block", "dense"])
def test_out_receives_the_step_in_either_layout_and_bad_outs_are_refused(fused):
    """``out=``: the same step written into a given tensor (the fused block step writes straight into an ``out`` of
    the particles' layout, copies into one of the other layout; the dense path copies), returned as is."""
    block = PatchDCTBlock(8, 8, 4, (2, 2))
    dirs = block if fused else block.matrix(torch.float32)
    table, levels = _table(64, 4, 5)
    kw = dict(noise_std=0.0, step_size=30.0, sketch=(table, levels), domain=(0.0, 1.0), backend="cpu",
              return_drift=False)
    x = torch.rand(64, 77, generator=torch.Generator().manual_seed(1)).t()  # coordinate-major, N = 77
    want = flow_step(x, None, dirs, **kw)[0]
    for out in (torch.full((64, 77), 7.0).t(), torch.full((77, 64), 7.0)):  # the particles' layout, the other one
        before = x.clone()
        got = flow_step(x, None, dirs, out=out, error_if_nonfinite=True, **kw)[0]
        assert got is out and torch.equal(got, want) and torch.equal(x, before)
    for bad, match in ((torch.empty(77, 63), "shape"), (torch.empty(77, 64, dtype=torch.float64), "dtype"),
                       (x, "share memory"), (x.t().t()[:, :], "share memory"),
                       (torch.empty(77, 64, requires_grad=True), "grad"), ("x", "torch.Tensor")):
        with pytest.raises(ValueError, match=match):
            flow_step(x, None, dirs, out=bad, **kw)


@needs_cpp
@pytest.mark.parametrize("fused", [True, False], ids=["fused-block", "dense"])
def test_non_finite_particles_are_refused_and_a_non_finite_step_raises_on_request(fused):
    """The fused block step reads the particles' finiteness in its first pass (no separate pass in Python) and
    refuses them with the message of every other path before writing anything; ``error_if_nonfinite`` raises
    FloatingPointError for a step that produced NaN or Inf (here: an overflow without a domain)."""
    block = PatchDCTBlock(8, 8, 4)
    dirs = block if fused else block.matrix(torch.float32)
    table, levels = _table(64, 3, 6)
    kw = dict(noise_std=0.0, step_size=1.0, sketch=(table, levels), backend="cpu")
    for bad in (float("nan"), float("inf"), -float("inf")):
        for c, i in ((0, 0), (37, 20), (63, 49)):  # the first tile, a middle one, the partial last tile
            store = torch.rand(64, 50, generator=torch.Generator().manual_seed(2))
            store[c, i] = bad
            x = store.t()  # coordinate-major particles (50, 64)
            out = torch.full((64, 50), 3.0).t()
            with pytest.raises(ValueError, match="particles contains non-finite values"):
                flow_step(x, None, dirs, out=out, **kw)
            assert bool((out == 3.0).all())  # nothing written
    huge = torch.full((50, 64), 3e38)  # finite; the step's residuals overflow float32
    huge[::2] = -3e38
    for layout in (huge, huge.t().contiguous().t()):  # the fused step's two write paths (rows; a flow's columns)
        step = flow_step(layout, None, dirs, **kw)[0]  # without the flag the step returns what it computed
        assert not bool(torch.isfinite(step).all())
        with pytest.raises(FloatingPointError, match="non-finite"):
            flow_step(layout, None, dirs, error_if_nonfinite=True, **kw)
    fine = torch.rand(50, 64, generator=torch.Generator().manual_seed(3))
    assert bool(torch.isfinite(flow_step(fine, None, dirs, error_if_nonfinite=True, **kw)[0]).all())


@needs_cpp
def test_a_released_flow_double_buffers_its_particles_and_keeps_them_after_a_failed_step(monkeypatch):
    """ReleasedTargetFlow steps into a spare buffer swapped with its particles (no tensor allocated per step); a
    step that fails leaves the particles as they were; the spare is freed when run() ends."""
    from fastdpot.flows import ReleasedTargetFlow
    import fastdpot.flows.released as released

    blocks = patch_dct_blocks(8, 8, 1, patches=((8, 0, 0), (4, 2, 2)))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 64, generator=g, dtype=torch.float64)
    rel = class_quantile_sketch(x, torch.arange(200) % 2, blocks, num_classes=2, sketch_bins=4, noise_multiplier=0.5,
                                clip_radius=3.0, secure_mode=False, generator=torch.Generator().manual_seed(3),
                                centers=torch.full((64,), 0.5, dtype=torch.float64))
    flow = ReleasedTargetFlow(rel, 0, 120, domain=(0.0, 1.0), generator=torch.Generator().manual_seed(1))
    flow.step()
    a, b = flow._particles, flow._spare
    flow.step()
    assert flow._particles is b and flow._spare is a  # swapped, not reallocated
    kept = flow.particles.clone()
    real = released.flow_step

    def failing(*args, **kwargs):
        real(*args, **kwargs)  # writes the spare
        raise FloatingPointError("flow_step produced non-finite particles")
    monkeypatch.setattr(released, "flow_step", failing)
    with pytest.raises(FloatingPointError, match="step 2 produced non-finite particles; they keep their last value"):
        flow.step()
    assert torch.equal(flow.particles, kept) and flow.steps_taken == 2
    monkeypatch.setattr(released, "flow_step", real)
    flow.run(steps=2)
    assert flow._spare is None and flow.steps_taken == 4
