"""Command modules, one per area; each exposes `register(app)`."""
