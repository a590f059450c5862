"""Old import path of :mod:`fastdpot.mainjob.data.datasets`, where the code lives (the main job is
``fastdpot/mainjob/``); only re-exports the public names."""
from ..mainjob.data.datasets import (FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, ImageData,  # noqa: F401
                                     load_celeba_folder, load_dataset, load_digits, load_fashion_mnist,
                                     load_fashion_mnist_available, load_lfw_subset, load_mnist_format,
                                     public_private_split, to_float)

__all__ = ["ImageData", "FASHION_MNIST_DIR", "load_fashion_mnist", "load_mnist_format", "load_celeba_folder",
           "load_digits", "load_lfw_subset", "load_dataset", "public_private_split", "to_float"]
