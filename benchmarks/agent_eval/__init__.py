"""The agent benchmark: scenarios recorded from real runs and drills, replayed through the replay
scheduler and monitor, and scored from the agent's structured answer and the gate's log (no judge
model): localization, cause, cited evidence, safety, efficiency; k runs each, pass@1 and pass^k."""
