"""What happened to a job: fault injection, detection, interruptions and their causes, drills' records,
checkpoints and their quarantine, SDC checks, escalations on a watched job."""
