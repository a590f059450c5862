"""pytest configuration of the benchmark suites (``pytest bench/ --benchmark-only``; never part of the default run,
whose ``testpaths`` is ``tests``).

* torch runs on ``$FASTDPOT_BENCH_THREADS`` threads (default 2, the cores of the reference machine);
* KeOps compiles into the project's cache (``.cache/keops``);
* pytest-benchmark's ``machine_info`` gets the CPU model, cores, threads, GPU and library versions
  (:func:`bench.store.machine_extra`), and its ``commit_info`` the measured commit (``$FASTDPOT_TREE_COMMIT`` wins
  over git, for a copy of the tree whose ``.git`` is stale).
"""
import os

from bench.store import ROOT, machine_extra

os.environ.setdefault("KEOPS_CACHE_FOLDER", os.path.join(ROOT, ".cache", "keops"))
THREADS = int(os.environ.get("FASTDPOT_BENCH_THREADS", "2"))


def pytest_configure(config):
    import torch

    torch.set_num_threads(THREADS)


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info.update(machine_extra(THREADS))


def pytest_benchmark_update_commit_info(config, commit_info):
    given = os.environ.get("FASTDPOT_TREE_COMMIT", "").strip()
    if given:
        commit_info.update(id=given.split("+")[0], dirty=given.endswith("+dirty"))
