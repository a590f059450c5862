"""Old import path of :mod:`fastdpot.mainjob.pipeline`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.pipeline`` and ``from fastdpot.pipeline import ...`` keep
working.
"""
from .mainjob.pipeline import (DEFAULT_NUM_BINS, METHODS, PipelineConfig, calibrate_spread,  # noqa: F401
                               public_centers, run_pipeline, samples_grid, seed_summary, stage_autoencoder,
                               stage_data, stage_decode, stage_flow, stage_metrics, write_outputs)

__all__ = ["PipelineConfig", "run_pipeline", "stage_data", "stage_autoencoder", "stage_flow", "calibrate_spread",
           "stage_decode", "stage_metrics", "write_outputs", "samples_grid"]
