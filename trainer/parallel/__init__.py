"""Tensor/sequence parallel (`tp.apply_tp`) and pipeline parallel (`pp.build_pipeline`) for the
trainer's `Transformer`; `trainops.trainer.parallelize` applies them in torchtitan's order. Nothing
is imported here: pipelining loads torch._dynamo and sympy, which a run without pp > 1 never needs."""
