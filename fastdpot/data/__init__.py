"""Old import path of :mod:`fastdpot.mainjob.data`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.data`` and ``from fastdpot.data import ...`` keep
working (``fastdpot.data.datasets`` and ``fastdpot.data.idx`` likewise).
"""
from ..mainjob.data import (FASHION_MNIST_DIR, ImageData, find_idx_file, load_celeba_folder,  # noqa: F401
                            load_dataset, load_digits, load_fashion_mnist, load_idx_split, load_lfw_subset,
                            load_mnist_format, public_private_split, read_idx, to_float)
