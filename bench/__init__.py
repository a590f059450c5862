"""fastdpot benchmarks: one harness (bench/harness.py), one results file (bench/results.jsonl), one renderer."""
