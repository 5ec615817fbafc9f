"""Checks on text that leaves the system: reports, summaries, agent answers.

R-OUT-1 the first line is a verdict and its blockers; R-OUT-2 no placeholder survives;
R-OUT-3 numbers are written one way (units on parameter counts, ranges with `~`, no space
before `%`). Number checks skip fenced code blocks, where commands keep their own syntax.
"""
from __future__ import annotations

import re

from pydantic import BaseModel, Field

_HTML_TAGS = {
    "a", "b", "i", "p", "br", "hr", "em", "strong", "code", "pre", "div", "span", "table", "thead", "tbody",
    "tr", "td", "th", "ul", "ol", "li", "img", "h1", "h2", "h3", "h4", "h5", "h6", "html", "head", "body",
    "title", "style", "meta", "link", "section", "details", "summary", "sup", "sub", "small", "figure",
    "figcaption", "caption", "blockquote", "header", "footer", "main", "nav", "svg", "kbd",
}

_PLACEHOLDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(TODO|TBD|TBA|FIXME|XXX)\b"), "placeholder marker"),
    (re.compile(r"lorem ipsum", re.I), "filler text"),
    (re.compile(r"(?<![\w/])N/A(?![\w/])", re.I), "'N/A' used as a value"),
    (re.compile(r"\?{3,}"), "question marks in place of a value"),
    (re.compile(r"<\s*(?:\.\.\.|…)\s*>|\[\s*(?:\.\.\.|…|placeholder)\s*\]", re.I), "elided placeholder"),
    (re.compile(r"\{\{[^{}]*\}\}"), "unrendered template field"),
    (re.compile(r"待定|待补充|占位"), "placeholder marker"),
]
_ANGLE = re.compile(r"<([A-Za-z][A-Za-z0-9 _-]{0,40})>")

_UNIT = r"(?:%|[KMBT]\b|\s?(?:GiB|GB|TB|ms|min|s|h|GPUs|nodes)\b)"
_NUMBER_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\d+(?:\.\d+)?\s+%"), "space before '%': write 41.2% not 41.2 %"),
    (re.compile(rf"(?<![\w.~-])\d+(?:\.\d+)?{_UNIT}?\s*(?:-|–|—|\bto\b)\s*\d+(?:\.\d+)?{_UNIT}"),
     "range not written with '~': write 40~55% (or 8~16 GPUs)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s+(?:billion|million|trillion)\s+param", re.I),
     "parameter count spelled out: write 8B / 350M parameters"),
    (re.compile(r"\b\d[\d,]{3,}\s+param(?:eter)?s\b", re.I), "raw parameter count: write it with a unit (8B, 350M)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s+[KMBT]\s+(?:param|model)", re.I), "space inside a parameter unit: write 70B"),
]

_VERDICT = re.compile(r"^verdict:\s*(pass|fail|partial)\b(.*)$", re.I)


class Violation(BaseModel):
    rule_id: str = Field(description="The AGENTS.md rule the text breaks.")
    line: int = Field(description="1-based line number.")
    excerpt: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule_id} line {self.line}: {self.message} (found {self.excerpt!r})"


def check_text(text: str) -> list[Violation]:
    """Placeholder (R-OUT-2) and number-format (R-OUT-3) violations, line by line."""
    found: list[Violation] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        for pattern, what in _PLACEHOLDERS:
            for match in pattern.finditer(line):
                found.append(Violation(rule_id="R-OUT-2", line=number, excerpt=match.group(0),
                                       message=f"{what}: replace it with the real value or remove the line"))
        for match in _ANGLE.finditer(line):
            if match.group(1).strip().lower() not in _HTML_TAGS:
                found.append(Violation(rule_id="R-OUT-2", line=number, excerpt=match.group(0),
                                       message="angle-bracket placeholder: fill in the value"))
        if in_code:
            continue
        for pattern, fix in _NUMBER_RULES:
            for match in pattern.finditer(line):
                found.append(Violation(rule_id="R-OUT-3", line=number, excerpt=match.group(0), message=fix))
    return found


def validate_report_text(md: str) -> list[Violation]:
    """All violations of a rendered report: its first line must be `Verdict: pass|fail|partial`
    (fail and partial followed by `blockers: ...`), and the whole text must pass `check_text`."""
    lines = md.splitlines()
    first_index = next((i for i, line in enumerate(lines) if line.strip()), None)
    found: list[Violation] = []
    if first_index is None:
        found.append(Violation(rule_id="R-OUT-1", line=1, excerpt="",
                               message="report is empty: start with 'Verdict: ...'"))
    else:
        first = lines[first_index].strip().lstrip("#").strip().strip("*").strip()
        match = _VERDICT.match(first)
        if not match:
            found.append(Violation(rule_id="R-OUT-1", line=first_index + 1, excerpt=first[:80],
                                   message="first line is not a verdict: start with 'Verdict: pass', "
                                           "'Verdict: fail — blockers: ...' or 'Verdict: partial — blockers: ...'"))
        elif match.group(1).lower() != "pass" and not re.search(r"blockers?:\s*\S", match.group(2), re.I):
            found.append(Violation(rule_id="R-OUT-1", line=first_index + 1, excerpt=first[:80],
                                   message=f"verdict {match.group(1)} names no blockers: add 'blockers: ...'"))
    return found + check_text(md)
