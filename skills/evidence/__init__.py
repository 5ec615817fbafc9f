"""The evidence pack: model, renderers, plots and the validated writer."""
