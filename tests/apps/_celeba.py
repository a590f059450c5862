"""A CelebA folder the tests write: ``n`` random aligned-CelebA-sized JPEGs (178 × 218, RGB) in
``tmp_path/img_align_celeba`` (tests/apps/test_pipeline.py, test_oneshot.py)."""
import numpy as np


def write_random_celeba(tmp_path, n: int, seed: int = 0) -> str:
    """Write the folder; returns its path."""
    from PIL import Image

    folder = tmp_path / "img_align_celeba"
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (218, 178, 3), dtype=np.uint8)).save(folder / f"{i:06d}.jpg")
    return str(folder)
