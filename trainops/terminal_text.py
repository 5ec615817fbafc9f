"""Text from a tool, a file, a log, a model or a user, made safe to show on a terminal.

A terminal obeys what it is sent: a CSI sequence (ESC `[`, or the 8-bit U+009B) moves the cursor
and rewrites a row of an approvals table, an OSC sequence (ESC `]`, U+009D) writes the clipboard
or the window title, a bidi override shows `8` where the bytes say `4096`. `visible` shows every
such character as its escape (`\\x1b`, `\\u009b`, `\\u202e`), so a sequence prints as inert text
that a reader can see: with its introducer (ESC or the C1 character) and its terminator (BEL or
ST) made visible, the rest of a CSI/OSC/DCS/APC/PM/SOS sequence is plain printable text. Newlines
and tabs stay. `safe_console` is the one rich Console every command prints through: each text
segment it renders passes through `visible`, while rich's own styling stays.

A bottom module (layer 0): it imports nothing of trainops, and rich only inside `safe_console`.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1 (8-bit CSI, OSC, DCS, APC, PM, SOS, ST)
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidi marks, embeddings, overrides and isolates
    "\u2028\u2029"  # line and paragraph separators
    "\ud800-\udfff]"  # lone surrogates (undecodable bytes): they cannot even be encoded for the terminal
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control, bidi and separator character shown as its escape; idempotent."""
    return UNSAFE.sub(_escape, text) if UNSAFE.search(text) else text


def is_visible(text: str) -> bool:
    """Whether `text` shows on a terminal as what it says (nothing for `visible` to escape)."""
    return UNSAFE.search(text) is None


def shown_name(name: str, valid: bool) -> str:
    """An id or a name found on disk or in a database, as a listing shows it: escaped, and marked
    when it is not one trainops could have created."""
    return name if valid else f"{visible(name)} (invalid name)"


@lru_cache(maxsize=1)
def _safe_console_class() -> type:
    def safe_text(text: Text) -> Text:
        """A copy of `text` with its unsafe characters escaped and its styles kept, so that rich
        measures and wraps what will be shown (escaping after layout would crop table cells)."""
        if is_visible(text.plain):
            return text
        out, last = text.blank_copy(), 0
        for match in UNSAFE.finditer(text.plain):
            out.append_text(text[last:match.start()])
            out.append(visible(match.group()))
            last = match.end()
        out.append_text(text[last:])
        return out

    class SafeConsole(Console):
        """A Console whose rendered text can move no cursor, write no clipboard and reverse no
        digits: strings and Text objects are escaped before layout, any other segment after."""
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(visible(text), **kwargs)

        def render(self, renderable: Any, options: Any = None):
            if isinstance(renderable, Text):
                renderable = safe_text(renderable)
            for segment in super().render(renderable, options):
                if segment.control or is_visible(segment.text):
                    yield segment
                else:
                    yield Segment(visible(segment.text), segment.style)

    return SafeConsole


def safe_console(**kwargs: Any):
    """A rich Console (same arguments) that shows untrusted text inertly; see the module docstring."""
    return _safe_console_class()(**kwargs)
