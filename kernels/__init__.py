"""Triton GPU kernels (shipped as the subpackage fastdpot.kernels; on CPU they run under TRITON_INTERPRET=1)."""
