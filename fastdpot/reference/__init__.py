"""Pure-PyTorch reference implementations: the baseline every fast path is tested and benchmarked against."""
