"""Data for the main job: IDX reader, Fashion-MNIST, CelebA folders, wheel-shipped fallbacks, public/private split."""
from .datasets import (FASHION_MNIST_DIR, ImageData, load_celeba_folder, load_dataset, load_digits,  # noqa: F401
                       load_fashion_mnist, load_lfw_subset, load_mnist_format, public_private_split, to_float)
from .idx import find_idx_file, load_idx_split, read_idx  # noqa: F401
