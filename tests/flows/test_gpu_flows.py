"""Private flows on CUDA through the public API (skipped without a CUDA GPU; run by ``scripts/gpu_check.sh``):
the sketch release on the ``cuda`` backend against the ``triton`` backend (same Philox streams, so the same
particles), and the sharded histogram flow on an NCCL group of world size 1 against the same flow on a gloo group on
the CPU (same keyed draws, torch phases on both devices)."""
import os

import pytest
import torch
import torch.distributed as dist

from fastdpot._cuda_prims import cuda_status
from fastdpot.flows import DistributedSlicedWassersteinFlow, DPSlicedWassersteinFlow

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") == "1",
                       reason="CUDA checks run the compiled kernels: unset TRITON_INTERPRET (scripts/gpu_check.sh)"),
]


def _private(n=3000, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.3, 1.5, d) + 0.2
    return x / x.norm(dim=1, keepdim=True)


@pytest.mark.skipif(not cuda_status()[0], reason="needs the built fastdpot._C_cuda_flow")
def test_sketch_flow_cuda_backend_equals_triton():
    private = _private()
    kw = dict(step_size=0.3, target_epsilon=10.0, delta=1e-5, batch_size=200, steps=6, release="sketch", sketch_bins=5,
              quantiles="exact", secure_mode=False, device="cuda")
    runs = []
    for backend in ("cuda", "triton"):
        f = DPSlicedWassersteinFlow(200_000, 8, 16, backend=backend, generator=torch.Generator().manual_seed(1), **kw)
        f.run(private, progress=False)
        runs.append(f)
    a, b = runs
    assert a.steps_taken == b.steps_taken == 6 and a.epsilon() == b.epsilon() <= 10.0
    assert torch.isfinite(a.particles).all()
    torch.testing.assert_close(a.particles, b.particles, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not dist.is_available() or not dist.is_nccl_available(), reason="needs NCCL")
def test_sharded_histogram_flow_nccl_world_size_1_equals_gloo_cpu(tmp_path):
    private = _private()
    kw = dict(step_size=0.5, diffusion=0.01, noise_multiplier=1.5, delta=1e-5, batch_size=200, steps=5,
              quantiles="histogram", histogram_bins=64, secure_mode=False, backend="reference")
    out = {}
    for name, backend_pg, device in (("nccl", "nccl", "cuda"), ("gloo", "gloo", "cpu")):
        dist.init_process_group(backend_pg, init_method=f"file://{tmp_path / ('store-' + name)}", rank=0,
                                world_size=1)
        try:
            f = DistributedSlicedWassersteinFlow(50_000, 8, 16, device=device,
                                                 generator=torch.Generator().manual_seed(4),
                                                 process_group=dist.group.WORLD, **kw)
            f.run(private, progress=False)
            out[name] = (f.particles.detach().cpu().double(), f.epsilon(), f.steps_taken)
        finally:
            dist.destroy_process_group()
    (xa, ea, ta), (xb, eb, tb) = out["nccl"], out["gloo"]
    assert ta == tb == 5 and ea == eb
    assert torch.isfinite(xa).all()
    # float32 on two devices: a few projections may fall in the neighbouring bin (a level moves by ~1/N)
    rel = ((xa - xb).pow(2).mean() / xb.pow(2).mean()).sqrt().item()
    assert rel < 1e-3, rel
