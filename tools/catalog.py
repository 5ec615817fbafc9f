"""Imports every tool module so that its tools register. Add a module here when you add tools."""
from trainops.tools import planning  # noqa: F401  (plan_checkpoint_interval, plan_effective_training_time, plan_layout)
from trainops.tools import env  # noqa: F401  (declare_environment)
from trainops.tools import detection, faults, jobs  # noqa: F401  (jobs/nodes/metrics tools, inject_fault, detect_faults)
from trainops.tools import tenancy  # noqa: F401  (set_tenant_quota, change_scheduler_policy, upgrade_framework)
from trainops.tools import checkpoints  # noqa: F401  (list_checkpoints, verify_checkpoint, measure_checkpoint_io)
from trainops.tools.frameworks import checks  # noqa: F401  (framework_knobs, check_framework_job)
