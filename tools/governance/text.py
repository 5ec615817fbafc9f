"""Checks on text that leaves the system: reports, summaries, agent answers.

R-OUT-1 the first line is a verdict and its blockers; R-OUT-2 no placeholder survives (TODO,
XX%, {field}, ${VAR}); R-OUT-3 numbers are written one way, as the seed says: units glued to
parameter counts (70B), ranges with `~`, no space before `%`, ASCII digits; R-EVD-1 a percentage
range carries its basis (a `RangeStatement` is built from the text); R-ENV-2 no MFU above 100%.
Number checks skip code (fenced blocks and inline spans), where commands keep their own syntax,
and read Markdown escapes (`40\\~55%`) as the characters they show.
"""
from __future__ import annotations

import re

from pydantic import BaseModel, Field, ValidationError

from trainops.tools.governance.claims import RangeStatement

_HTML_TAGS = {
    "a", "b", "i", "p", "br", "hr", "em", "strong", "code", "pre", "div", "span", "table", "thead", "tbody",
    "tr", "td", "th", "ul", "ol", "li", "img", "h1", "h2", "h3", "h4", "h5", "h6", "html", "head", "body",
    "title", "style", "meta", "link", "section", "details", "summary", "sup", "sub", "small", "figure",
    "figcaption", "caption", "blockquote", "header", "footer", "main", "nav", "svg", "kbd",
}

_PLACEHOLDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(?:TODO|TBD|TBA|FIXME)\b", re.I), "placeholder marker"),
    (re.compile(r"(?<![\w.])(?:X{2,}(?:\.X+)?(?:\s?[%％])?|[xX]{1,3}(?:\.[xX]+)?\s?[%％])(?!\w)"),
     "'XX' in place of a figure"),
    (re.compile(r"\$\{[^{}\n]*\}"), "unexpanded variable"),
    (re.compile(r"(?<![{}\w$^_\\])\{\s*[A-Za-z_][\w.-]{0,40}\s*\}(?!\})"), "unfilled template field"),
    (re.compile(r"lorem ipsum", re.I), "filler text"),
    (re.compile(r"(?<![\w/])N/A(?![\w/])", re.I), "'N/A' used as a value"),
    (re.compile(r"\?{3,}"), "question marks in place of a value"),
    (re.compile(r"<\s*(?:\.\.\.|…)\s*>|\[\s*(?:\.\.\.|…|placeholder)\s*\]", re.I), "elided placeholder"),
    (re.compile(r"\{\{[^{}]*\}\}"), "unrendered template field"),
    (re.compile(r"待定|待补充|占位"), "placeholder marker"),
]
_ANGLE = re.compile(r"<([A-Za-z][A-Za-z0-9 _-]{0,40})>")

_NUM = r"\d+(?:\.\d+)?"
_UNIT = r"(?:%|x\b|[KMBT]\b|\s?(?:GiB|GB|MB|TB|ms|min|s|h|GPUs?|nodes?|tokens|steps)\b)"
_NOT_AFTER = r"(?<![\w.~/:#@+=,\[\-–—])"  # not inside a word, version, path, flag, id, hostlist or date
_NOT_YEAR_MONTH = r"(?!(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?!\d))"
_NUMBER_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"{_NUM}\s+[%％]"), "space before '%': write 41.2% not 41.2 %"),
    (re.compile(rf"{_NOT_AFTER}{_NOT_YEAR_MONTH}{_NUM}{_UNIT}?(?:\s*[-–]\s*|—){_NUM}{_UNIT}?(?![\w\-–—:]|\.\d)"),
     "range not written with '~': write 40~55% (or batch 8~16)"),
    (re.compile(rf"{_NOT_AFTER}{_NUM}{_UNIT}?\s*\bto\b\s*{_NUM}{_UNIT}"),
     "range not written with '~': write 40~55% (or 8~16 GPUs)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s+(?:billion|million|trillion)\s+param", re.I),
     "parameter count spelled out: write 8B / 350M parameters"),
    (re.compile(r"\b\d[\d,]{3,}\s+param(?:eter)?s\b", re.I), "raw parameter count: write it with a unit (8B, 350M)"),
    (re.compile(rf"(?<![\w.]){_NUM}\s+[KMBT]\b(?:\s+(?:param\w*|model))?"),
     "space inside a unit: write 70B, 350M, 1.2T (the unit glued to the number)"),
    (re.compile(r"[０-９]+|％|(?<=[\d０-９])\s*[～〜]\s*(?=[\d０-９])"),
     "full-width character in a number: write ASCII digits, '%' and '~' (42%, 40~55%)"),
]
_RANGE = re.compile(rf"{_NOT_AFTER}(?P<low>{_NUM})(?:\s?[%％])?\s*(?:~|～|〜|-|–|—)\s*(?P<high>{_NUM})\s?[%％]")
_EXPERIENTIAL = re.compile(r"(?:empirical|experiential) range,?\s+not an? official benchmark"
                           r"|经验区间\s*[，,]?\s*非官方基准", re.I)
_SOURCE = re.compile(r"\b(?P<kind>source|measured|official benchmark)\s*[:：]\s*(?P<what>[^;)\n]*[^;)\s])", re.I)
_MFU_FIGURE = re.compile(rf"\bMFU\b[^;,|%\d+\-]{{0,30}}(?<![+\-\d.])(?P<a>{_NUM})\s?[%％](?!\s*[~～〜\-–])"
                         rf"|(?<![+\-\d.~])(?P<b>{_NUM})\s?[%％]\s+MFU\b", re.I)
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_INLINE_CODE = re.compile(r"(?<!\\)`[^`]*`")

_VERDICT = re.compile(r"^verdict:\s*(pass|fail|partial)\b(.*)$", re.I)


class Violation(BaseModel):
    rule_id: str = Field(description="The AGENTS.md rule the text breaks.")
    line: int = Field(description="1-based line number.")
    excerpt: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule_id} line {self.line}: {self.message} (found {self.excerpt!r})"


def check_text(text: str) -> list[Violation]:
    """Placeholder (R-OUT-2), number-format (R-OUT-3), range-basis (R-EVD-1) and MFU-ceiling
    (R-ENV-2) violations, line by line."""
    found: list[Violation] = []
    lines = text.splitlines()
    contexts = _range_contexts(lines)
    in_code = False
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        shown = _shown(line)
        for pattern, what in _PLACEHOLDERS:
            for match in pattern.finditer(shown):
                found.append(Violation(rule_id="R-OUT-2", line=number, excerpt=match.group(0),
                                       message=f"{what}: replace it with the real value or remove the line"))
        for match in _ANGLE.finditer(shown):
            if match.group(1).strip().lower() not in _HTML_TAGS:
                found.append(Violation(rule_id="R-OUT-2", line=number, excerpt=match.group(0),
                                       message="angle-bracket placeholder: fill in the value"))
        if in_code:
            continue
        prose = _prose(line)
        for pattern, fix in _NUMBER_RULES:
            for match in pattern.finditer(prose):
                found.append(Violation(rule_id="R-OUT-3", line=number, excerpt=match.group(0), message=fix))
        found += _range_violations(prose, contexts[number - 1], number) + _mfu_violations(prose, number)
    return found


def _shown(line: str) -> str:
    """What a Markdown line shows: a backslash escape (`40\\~55%`) read as its character."""
    return _ESCAPE.sub(r"\1", line)


def _prose(line: str) -> str:
    """The line as shown, its inline code spans blanked: commands keep their own syntax."""
    return _shown(_INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line))


def _range_contexts(lines: list[str]) -> list[str]:
    """Per line, the text of its paragraph, where a range finds its label; a table also takes
    the paragraphs just before and after it (its caption)."""
    blocks: list[list[int]] = [[]]
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("```"):
            blocks.append([])
        else:
            blocks[-1].append(i)
    blocks = [b for b in blocks if b]
    texts = [" ".join(_shown(lines[i]) for i in block) for block in blocks]
    contexts = [""] * len(lines)
    for k, block in enumerate(blocks):
        table = all(lines[i].lstrip().startswith("|") for i in block)
        for i in block:
            contexts[i] = " ".join(texts[max(k - 1, 0):k + 2]) if table else texts[k]
    return contexts


def _range_violations(prose: str, context: str, number: int) -> list[Violation]:
    """R-EVD-1 on each percentage range: it must make a valid `RangeStatement` with the basis
    its paragraph states (the empirical-range label, or a named source)."""
    basis, source = None, None
    if _EXPERIENTIAL.search(context):
        basis = "experiential"
    elif named := _SOURCE.search(context):
        basis = "measured" if named.group("kind").lower() == "measured" else "official_benchmark"
        source = named.group("what")
    found = []
    for match in _RANGE.finditer(prose):
        quantity = "MFU" if re.search(r"\bMFU\b", prose[:match.start()], re.I) else "percentage"
        try:
            RangeStatement(quantity=quantity, low=float(match["low"]), high=float(match["high"]), unit="%",
                           basis=basis, source=source)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"].removeprefix("Value error, ").removeprefix("R-EVD-1: ")
            message = (f"range {match.group(0)} states no basis: label it '(empirical range, not an official "
                       f"benchmark)' in its paragraph, or name its source ('measured: RUN' or 'source: "
                       f"PUBLICATION, TABLE')" if basis is None else f"range {match.group(0)}: {problem}")
            found.append(Violation(rule_id="R-EVD-1", line=number, excerpt=match.group(0), message=message))
    return found


def _mfu_violations(prose: str, number: int) -> list[Violation]:
    """R-ENV-2: an MFU above 100% of peak was not measured (the device's peak is wrong or missing)."""
    return [Violation(rule_id="R-ENV-2", line=number, excerpt=match.group(0),
                      message="MFU above 100% of peak cannot come from a measured run: the device's peak FLOP/s "
                              "is wrong or missing from the peak table; fix the peak and recompute from the run")
            for match in _MFU_FIGURE.finditer(prose) if float(match["a"] or match["b"]) > 100]


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
