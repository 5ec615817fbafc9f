"""Framework adapters: run the SOP on jobs written for DeepSpeed, torchtitan, Megatron-LM or
the embedded trainer. Each adapter maps the framework's own flags to trainops' knobs, refuses
flag combinations the framework forbids before launch, builds a scheduler-neutral `JobSpec`,
and parses the framework's step log lines into trainops' step metrics."""
