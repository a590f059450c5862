"""bench.harness: the measured tree's commit in every row."""
import subprocess

from bench import harness


def test_git_rev_prefers_the_commit_the_caller_names(monkeypatch):
    monkeypatch.setenv("FASTDPOT_TREE_COMMIT", "abc1234")
    assert harness.git_rev() == "abc1234"
    monkeypatch.setenv("FASTDPOT_TREE_COMMIT", "  ")                 # blank: ignored, git answers
    rev = harness.git_rev()
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    assert rev.split("+")[0] == head
