"""fastdpot benchmarks: pytest-benchmark suites (bench/test_*.py, cases in bench/<suite>.py, shared pieces in
bench/harness.py), GPU scripts (bench/gpu_*.py), one stored format (bench/store.py: pytest-benchmark JSON documents
in bench/results/), one renderer (bench/render.py)."""
