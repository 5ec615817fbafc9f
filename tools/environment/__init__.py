"""The environment declaration (S1): probes, measured interconnect, the declared facts."""
