"""The diagnosis benchmark: real failure logs from public threads (cases/), each replayed through
trainops' own launch path and scored on the interruption record it leaves (replay.py)."""
