"""Imports every tool module so that its tools register. Add a module here when you add tools."""
from tools import planning  # noqa: F401  (plan_checkpoint_interval, plan_effective_training_time, plan_layout)
