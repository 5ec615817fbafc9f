"""The performance suite: every figure measured side by side in one run, as ratios."""
