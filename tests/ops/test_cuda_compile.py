"""The CUDA extension's source compiles for the GPUs the project targets, without a GPU: nvcc (host and device code,
ptxas included) on ``csrc/cuda/flow.cu`` for sm_90 (H100 / H200) and sm_80 (A100). The toolkit comes from the
CUDA_HOME / PATH install or from the ``nvidia-cuda-nvcc`` / ``nvidia-cuda-cccl`` wheels of the ``test`` extra (as
``tests/test_triton_compile.py`` compiles the Triton kernels). Linking and running need a GPU machine:
``scripts/gpu_check.sh``."""
import os
import shutil
import subprocess
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _toolkit():
    """(nvcc, include folders) of the first CUDA toolkit found, or None."""
    roots = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        roots.append(home)
    found = shutil.which("nvcc")
    if found:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(found))))
    try:
        import nvidia  # the pip wheels' namespace package: nvidia/cu13/{bin,include}

        roots += [os.path.join(base, "cu13") for base in nvidia.__path__]
    except ImportError:
        pass
    for root in roots:
        nvcc = os.path.join(root, "bin", "nvcc")
        if os.path.isfile(nvcc) and os.access(nvcc, os.X_OK):
            inc = [os.path.join(root, "include", "cccl"), os.path.join(root, "include")]
            return nvcc, [d for d in inc if os.path.isdir(d)]
    return None


TOOLKIT = _toolkit()


@pytest.mark.skipif(TOOLKIT is None, reason="no CUDA toolkit (nvcc): pip install -e '.[test]' brings one")
def test_cuda_extension_compiles_for_sm90_and_sm80(tmp_path):
    import pybind11

    nvcc, includes = TOOLKIT
    cmd = [nvcc, "-std=c++17", "-O1", "-Xcompiler", "-fPIC", "-c", os.path.join(ROOT, "csrc", "cuda", "flow.cu"),
           "-o", str(tmp_path / "flow.o"), "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_80,code=sm_80", "-I", pybind11.get_include(),
           "-I", sysconfig.get_paths()["include"]]
    for d in includes:
        cmd += ["-I", d]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "flow.o").stat().st_size > 0
