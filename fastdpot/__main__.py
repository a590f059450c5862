"""``python -m fastdpot flow ...`` and the ``fastdpot`` console script (the main job: :mod:`fastdpot.experiments.mainjob.cli`)."""
import sys

from .experiments.mainjob.cli import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
