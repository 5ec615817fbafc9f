"""Changes a human approves and trainops can undo: scheduler policy, tenant quotas and tenancy,
framework upgrades against the compatibility matrix, recorded changes and their rollback."""
