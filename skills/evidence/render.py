"""Markdown and HTML renderings of an evidence pack, both from one `view.ReportView` through the
Jinja2 templates shipped next to this file. The first line of the Markdown is always the verdict
and its blockers, so a reviewer (or a grep) gets the answer before the detail; the HTML opens with
the same verdict as a coloured banner. Everything that came from runs or files is escaped: in the
Markdown by `view.md_text`/`view.code` (no heading, link or emphasis can come from a run), in the
HTML by Jinja's autoescape, and in both every control or bidi character shows as its escape
(`finalize`). markdown-it renders only the view's own prose, where run text is already escaped."""
from __future__ import annotations

import base64
import struct
from functools import lru_cache

from jinja2 import Environment, PackageLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

from trainops.skills.evidence.model import EvidencePack
from trainops.skills.evidence.steps_view import report_view
from trainops.skills.evidence.view import Cell, Figure, code, md_text
from trainops.terminal_text import visible

VERDICT_MEANING = {
    "pass": "every SOP step measured, no blocker",
    "partial": "part of the SOP is missing or did not beat the noise",
    "fail": "a recovery or a rollout check failed",
}


@lru_cache(maxsize=1)
def _markdown():
    """CommonMark with raw HTML off: text from runs renders as text, never as markup."""
    return MarkdownIt("commonmark", {"html": False})


def _md_cell(cell: Cell) -> str:
    """A table cell on one line; `|` is escaped inside a code span too (GFM tables split on it first)."""
    return code(cell.text).replace("|", "\\|") if cell.kind in ("code", "command", "path") else md_text(cell.text)


def _shown(value: object) -> object:
    """Every `{{ ... }}` value: control and bidi characters as escapes (markdown-it's HTML too)."""
    if isinstance(value, Markup):
        return Markup(visible(value))
    return visible(value) if isinstance(value, str) else value


def _png_size(png: bytes) -> list[tuple[str, int]]:
    """Width and height from the PNG header, so the page lays out before the image decodes."""
    width, height = struct.unpack(">II", png[16:24])
    return [("width", width), ("height", height)]


def _environment(markdown: bool) -> Environment:
    env = Environment(loader=PackageLoader("trainops.skills.evidence", "templates"), autoescape=not markdown,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined=StrictUndefined,
                      finalize=_shown)
    env.filters.update(
        md_cell=_md_cell,
        md_cell_text=lambda text: text.replace("|", "\\|"),
        md_text=md_text,
        md=lambda text: Markup(_markdown().render(text)),
        md_inline=lambda text: Markup(_markdown().renderInline(text)),
        data_uri=lambda png: "data:image/png;base64," + base64.b64encode(png).decode("ascii"),
        png_size=_png_size,
    )
    return env


@lru_cache(maxsize=2)
def _template(name: str):
    return _environment(markdown=name.endswith(".md.j2")).get_template(name)


def to_markdown(pack: EvidencePack, figures: list[Figure] = ()) -> str:
    """report.md; figures are linked from `plots/` next to it."""
    return _template("report.md.j2").render(view=report_view(pack, figures))


def to_html(pack: EvidencePack, figures: list[Figure] = ()) -> str:
    """report.html: one self-contained file, plots embedded as data URIs, no script, no network."""
    return _template("report.html.j2").render(view=report_view(pack, figures), meaning=VERDICT_MEANING)
