"""S5, the fault drill: inject, detect, isolate, restart, and time each phase (`drill.py`); what a
node drill adds (`nodes.py`), the recovery path a job took (`recovery.py`), the waits on a run and
its job (`waits.py`), and the restart and its verification (`restart.py`)."""
