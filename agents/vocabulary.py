"""The words the agent understands, declared once as data (agents/understand.py reads them): each
concept and the words that mean it, the phrases that mean a concept together, the fault kinds a
drill is named by, and the SOP's own words: its steps, the arms a person names by a word ("bf16",
"activation checkpointing") and the verbs that steer or resume it. Nothing here reads a request.
"""
from __future__ import annotations

VOCAB: dict[str, str] = {
    # what an order asks for: the action verbs
    "cancel": "cancel abort terminate scancel stop kill",
    "requeue": "requeue resubmit restart relaunch rerun retry",
    "resume": "resume undrain uncordon", "unquarantine": "unquarantine", "drain": "drain cordon evict isolate",
    "quarantine": "quarantine", "grant": "give grant set raise bump increase lower reduce allot allocate",
    "inject": "inject drill simulate", "launch": "run start launch kick trigger do execute fire",
    "take": "take put pull move bring get", "sop": "sop", "change": "turn disable enable change switch",
    "policy": "policy preemption preempt fairshare scheduling", "rollback": "rollback revert undo",
    "upgrade": "upgrade", "quick": "quick quickly", "save": "save saves saving write writes",
    "politeness": "please pls plz kindly can could would will you u i we go ahead and now just ok okay then lets let "
                  "us hey need want to asap also",
    # what a steer of the SOP asks for (skills/sop_steer.py), and going on with it
    "skip": "skip drop omit exclude no", "add": "add include try", "after": "after",
    "proceed": "continue proceed resume",
    # what a question is about
    "approval": "approval approvals approve pending sign signature", "checkpoint": "checkpoint checkpoints ckpt ckpts",
    "interval": "interval often frequency frequently cadence mtbf", "quota": "quota quotas tenant gpus gpu priority",
    "compare": "compare compared comparison versus vs slower faster lower higher than differ different difference "
               "changed change regression regressed regress worse better",
    "loaded": "resume resumed resuming restore restored load loaded loading fallback fell corrupt corrupted "
              "corruption damaged bad broken newest latest good valid verify verified which",
    "lost": "lose lost losing cost costs waste wasted",
    "time": "time hours minutes much long training wallclock",
    "straggler": "straggler straggling stragglers laggard holding",
    "slow": "slow slower slowed slowest sluggish lag lagging laggy", "rank": "rank ranks worker workers",
    "mfu": "mfu utilization utilisation flops tflops efficiency", "log": "log logs logfile stderr stdout",
    "jobs": "jobs queue queued", "nodes": "nodes hosts machines fleet", "why": "why cause caused causes root reason "
    "blame blamed because", "drill": "drill drills drilled", "node": "node host machine server box",
    "job": "job", "run": "run runs", "step": "step steps", "latest": "last latest newest recent previous",
    "yesterday": "yesterday yesterdays", "today": "today todays",
    "trouble": "cancelled canceled fail failed failure failing crash crashed crashes died dead die hung hang "
               "hanging stuck stall stalled "
               "froze frozen interrupted interruption interrupt stopped wrong broke broken error errors oom nan slow "
               "happened happen going healthy unhealthy sick off weird problem issue issues went",
    "read": "show list check look tell explain diagnose describe display print find fetch see summarize investigate "
            "status what whats how hows which who where when is was did does are were",
    # fault kinds, as a drill's job is named
    "node_loss": "node-loss",
    "crash": "crash crashed crashes", "hang": "hang hung hanging stall stalled froze frozen stuck",
    "nan": "nan nans inf diverged", "bitflip": "bitflip bit-flip sdc silent flip flipped checksum checksums",
    "partition": "partition partitioned", "network": "network nccl link interconnect",
    # everyday words a near word must not be taken for
    "noise": "train training trained trainer list last lots most much done dose note notes rain range brain cancer",
}
PHRASES: dict[tuple[str, ...], str] = {
    ("go", "on"): "proceed", ("carry", "on"): "proceed", ("keep", "going"): "proceed", ("node", "loss"): "node_loss",
    ("activation", "checkpointing"): "activation_checkpointing=selective", ("sequence", "parallel"):
    "sequence_parallel=true",
    ("out", "of", "service"): "drain", ("out", "of", "rotation"): "drain", ("back", "in", "service"): "resume",
    ("back", "into", "service"): "resume", ("holding", "back"): "straggler", ("was", "it"): "why",
    ("is", "it"): "why", ("due", "to"): "why", ("how", "often"): "interval", ("what", "if"): "interval",
}
FAULT_KINDS = {"node_loss": "node-loss", "crash": "crash", "hang": "hang", "nan": "nan", "bitflip": "bitflip",
               "straggler": "straggler", "partition": "partition", "network": "slow-network",
               "corrupt": "checkpoint-corruption"}
# The SOP's steps as a person names them ("stop after the baseline"): each is a concept, and so is any of them.
SOP_STEPS: dict[str, str] = {"S1": "s1 declaration declare", "S2": "s2 baseline baselines", "S3": "s3 design",
                             "S4": "s4 ablation ablations arm arms", "S5": "s5 drill drills", "S6": "s6 pack"}
# The arms a person names by a word (each one knob, NAME=VALUE, of the embedded trainer's catalogue,
# skills/knobs.py): the arm itself is the concept.
ARMS: dict[str, str] = {
    "activation_checkpointing=selective": "activation-checkpointing recompute recomputation remat",
    "precision=bf16": "bf16 bfloat16", "compile=true": "compile torch.compile", "data_kind=synthetic": "synthetic",
    "data_parallel=ddp": "ddp", "comm_overlap=true": "overlap", "sequence_parallel=true": "sequence-parallel",
}
VOCAB |= {**SOP_STEPS, "sopstep": " ".join(SOP_STEPS.values()), **ARMS}
