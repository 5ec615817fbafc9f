"""Secrets out of every error: a provider that echoes the API key, or a tool error that quotes an
environment, must not put the key on a terminal, in a log, in agent.sqlite or in front of the model.

`scrub` removes the values of environment variables whose names say they are secrets, and strings
shaped like the common key formats, whatever variable (if any) they came from. It sits at the
bottom, importing nothing of trainops, so every layer can scrub what it prints or keeps.
"""
from __future__ import annotations

import os
import re

REDACTED = "[redacted]"
_SECRET_NAME = re.compile(r"_API_KEY$|_TOKEN$|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_MIN_SECRET_CHARS = 8  # shorter values (EMPTY, 1, true) are not secrets and would blank out ordinary words
_KEY_SHAPES = re.compile(
    r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"      # OpenAI, Anthropic
    r"|gh[pousr]_[A-Za-z0-9]{20,}"               # GitHub
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"            # Slack
    r"|AKIA[0-9A-Z]{16}"                          # AWS access key id
    r"|AIza[0-9A-Za-z_-]{30,}"                    # Google
    r"|hf_[A-Za-z0-9]{20,}"                       # Hugging Face
    r"|(?<=Bearer )[A-Za-z0-9._~+/=-]{16,}"
)


def secret_values() -> list[str]:
    """Values of the environment's secret-named variables, longest first (so a key containing
    another is removed whole)."""
    values = {v for name, v in os.environ.items() if _SECRET_NAME.search(name) and len(v) >= _MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def scrub(text: object) -> str:
    """`text` (anything, as str) with every secret value and key-shaped string replaced by [redacted]."""
    out = str(text)
    for value in secret_values():
        out = out.replace(value, REDACTED)
    return _KEY_SHAPES.sub(REDACTED, out)
