"""Tensor/sequence parallel (`apply_tp`) and pipeline parallel (`build_pipeline`) for the
trainer's `Transformer`; `trainops.trainer.parallelize` applies them in torchtitan's order."""
from trainops.trainer.parallel.pp import Pipeline, build_pipeline, merged_view, split_model
from trainops.trainer.parallel.tp import apply_tp

__all__ = ["apply_tp", "build_pipeline", "split_model", "merged_view", "Pipeline"]
