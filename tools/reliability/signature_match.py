"""The generic matcher over the declared failure signatures (signatures.py): every line of a log
against every signature, hits ranked by specificity (then by where they appear: a root cause is
printed before the errors it sets off), and the rank, device and host a foreign log's prefixes
name (torchrun's `[default0]:`, `[Rank 1]`, `[rank3]:`, Lightning's `[rank: 0]`, NCCL's
`host:pid:tid [dev]`, DeepSpeed's `host: `, `GPU 4`, `cuda:2`)."""
from __future__ import annotations

import re

from pydantic import BaseModel, Field

from trainops.tools.reliability.signatures import FRAMEWORKS, SIGNATURES, Signature

MAX_HITS = 8
MAX_SCAN_LINES = 2000
TRUST_SPECIFICITY = 3
"""A hit this specific (or more) names a cause; below it, the record says what it saw."""

_RANK = [re.compile(p, re.I) for p in (r"\[Rank (\d+)\]", r"\[rank(\d+)\]:", r"\[rank: ?(\d+)\]",
                                       r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:",
                                       r"\bglobal_rank[=: ]+(\d+)", r"(?<![\w-])rank[ =:]+(\d+)\b")]
_DEVICE = [re.compile(p) for p in (r"^\[default(\d+)\]:", r"^\S+:\d+:\d+ \[(\d+)\] NCCL", r"\bGPU ?(\d+)\b",
                                   r"\bcuda:(\d+)", r"\bdevice[ =:]+(\d+)\b")]
_HOST = [re.compile(p) for p in (r"^([A-Za-z][\w-]*\d[\w.-]*):\d+:\d+ \[\d+\] NCCL", r"^([A-Za-z][\w-]*\d[\w.-]*): ",
                                 r"\bON ([A-Za-z][\w.-]+) CANCELLED", r"\bhostname=([A-Za-z][\w.-]+)")]


_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_EXCEPTION = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)*"  # a rank's prefix, then a (dotted) exception name
                        r"(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:? ")
TRACEBACK_REACH = 40
"""How many lines past a traceback's source line its exception line may sit (frames below it)."""
QUOTE_FROM_REACH = 8
"""How many lines above a hit a signature's `quote_from` line may sit (an error's trace below its WARN)."""
WRAP_REACH = 3
"""How many lines a message wrapped at a terminal's or a rich box's width may run over."""
WRAP_WIDTH = 60
"""A line broken at a width is at least this long (terminals and rich's boxes wrap at 70 columns or more)."""
_ENDS_MID_SENTENCE = re.compile(r"[\w,*+=(/-]\s*$")
_CONTINUES = re.compile(r"^\s*[a-z0-9]")
_NEW_RECORD = re.compile(r"^\s*(?:[\w.]+:\s|\d{4}-\d\d-\d\d|\S+:\d+:\d+ \[)")
"""A line that opens a record of its own ('name: message', a timestamp, NCCL's 'host:pid:tid [dev]')."""


def _wrapped_from(lines: list[str], index: int) -> int | None:
    """Where the exception message that lines[index] continues begins, or None: a message wrapped over
    lines (a rich traceback box, a terminal's width) reads as one only from its exception line on."""
    if not _CONTINUES.search(lines[index]) or _NEW_RECORD.search(lines[index]):
        return None
    for start in range(index - 1, max(index - 1 - WRAP_REACH, -1), -1):
        if len(lines[start].strip()) < WRAP_WIDTH or not _ENDS_MID_SENTENCE.search(lines[start]):
            return None
        if _EXCEPTION.search(lines[start]) and not _FRAME.search(lines[start]):
            return start
        if not _CONTINUES.search(lines[start]) or _NEW_RECORD.search(lines[start]):
            return None
    return None


def _quoted(lines: list[str], index: int, quote_from: re.Pattern | None = None) -> str:
    """The text to quote for a hit on lines[index]: the line `quote_from` names at or above it (NCCL's
    WARN above its `-> N` trace); a traceback's own exception line where the hit is a
    source line inside its frames (the code that raised is not the message: `raise X('loss became NaN')`
    reads better as `X: loss became NaN`); an exception message wrapped over lines, from its exception line
    to the hit; and a line ending in a colon with the line that completes it
    (`Error(s) in loading state_dict for M:` says nothing without the `size mismatch for ...` after it)."""
    if quote_from is not None:
        above = range(index, max(index - 1 - QUOTE_FROM_REACH, -1), -1)
        if (start := next((i for i in above if quote_from.search(lines[i])), None)) is not None:
            return lines[start].strip()
    line = lines[index].strip()
    if index and _FRAME.search(lines[index - 1]) and not _EXCEPTION.search(line):
        after = lines[index + 1:index + 1 + TRACEBACK_REACH]
        raised = next((ln.strip() for ln in after if _EXCEPTION.search(ln) and not _FRAME.search(ln)), None)
        if raised:
            return f"{raised} (raised at: {line})"
    if (start := _wrapped_from(lines, index)) is not None:
        return " ".join(ln.strip() for ln in lines[start:index + 1])
    if line.endswith(":") and index + 1 < len(lines) and not _FRAME.search(lines[index + 1]):
        return f"{line} {lines[index + 1].strip()}"
    return line


class SignatureHit(BaseModel):
    """One line a declared signature matched, and what the line's prefixes name."""
    name: str
    cause: str
    sub_cause: str
    specificity: int
    line: str = Field(description="The line as logged (bounded, made safe by the caller).")
    index: int = Field(description="Its position among the lines scanned.")
    rank: int | None = None
    device: int | None = None
    host: str | None = None


def signature(name: str) -> Signature:
    return next(s for s in SIGNATURES if s.name == name)


def _first(patterns: list[re.Pattern], line: str) -> str | None:
    for pat in patterns:
        if (m := pat.search(line)) is not None:
            return m.group(1)
    return None


def split_lines(text: str) -> list[str]:
    """Log lines, a progress bar's carriage returns splitting too; the last MAX_SCAN_LINES."""
    return [ln for ln in re.split(r"[\r\n]+", text or "") if ln.strip()][-MAX_SCAN_LINES:]


def match_lines(lines: list[str], clean=str) -> list[SignatureHit]:
    """Every (line, signature) hit, most specific first, then earliest; `clean` makes a line safe to keep.
    A signature that counts only `twice` hits on the second copy of the same matched text; one with `last_of`
    only on the last line of that kind."""
    hits, seen_once = [], set()
    last = {sig.name: max((i for i, ln in enumerate(lines) if sig.last_of.search(ln)), default=-1)
            for sig in SIGNATURES if sig.last_of is not None}
    for index, line in enumerate(lines):
        for sig in SIGNATURES:
            if sig.last_of is not None and index != last[sig.name]:
                continue
            if (m := sig.pattern.search(line)) and sig.twice and (sig.name, m.group(0)) not in seen_once:
                seen_once.add((sig.name, m.group(0)))  # one copy says nothing; the second is the evidence
            elif m:  # a twice hit names no failing rank: the rank it repeats was started twice, not failed
                rank, device = (None, None) if sig.twice else (_first(_RANK, line), _first(_DEVICE, line))
                hits.append(SignatureHit(name=sig.name, cause=sig.cause, sub_cause=sig.sub_cause,
                                         specificity=sig.specificity, line=clean(_quoted(lines, index, sig.quote_from)),
                                         index=index,
                                         rank=int(rank) if rank else None, device=int(device) if device else None,
                                         host=clean(h) if (h := _first(_HOST, line)) else None))
    return sorted(hits, key=lambda h: (-h.specificity, h.index))


def ranked(hits: list[SignatureHit]) -> list[SignatureHit]:
    """The hits to keep: the most specific of each signature first, bounded, so one repeated line
    does not crowd out a second kind of evidence."""
    seen, kept = set(), []
    for hit in sorted(hits, key=lambda h: (-h.specificity, h.index)):
        if hit.name in seen and len(kept) < MAX_HITS // 2:
            continue
        seen.add(hit.name)
        kept.append(hit)
    return kept[:MAX_HITS]


def framework_of(text: str) -> str | None:
    """The framework whose markers the log shows (its name as a reason reads it), or None."""
    return next((name for name, pat in FRAMEWORKS if pat.search(text or "")), None)


def waiting_ranks(hits: list[SignatureHit]) -> list[int]:
    """The ranks that report a collective timeout: they arrived and waited."""
    return sorted({h.rank for h in hits if h.cause == "hung-peer" and h.rank is not None})


def missing_ranks(waiting: list[int], world_size: int | None = None, torn_down: list[int] = ()) -> list[int]:
    """The one rank that did not report the timeout: where the world size is known (heartbeats, the
    job's spec) and every other rank of it reported, or the one rank the launcher stopped while it
    still ran (torchrun's teardown) that reported none: the one that did not arrive. Otherwise []: a
    rank absent from the log may be on another node's log, or one of several that stalled; the log
    does not tell."""
    if not waiting:
        return []
    if world_size and len(set(waiting)) >= world_size - 1:
        absent = sorted(set(range(world_size)) - set(waiting))
        return absent if len(absent) == 1 else []
    stopped = sorted(set(torn_down) - set(waiting))
    return stopped if len(stopped) == 1 else []


def named_cause(trusted: list[SignatureHit]) -> SignatureHit | None:
    """The first trusted hit that is not a collective timeout: a timeout is the symptom, a specific
    line printed before or after it (an OOM, a full disk, a shape mismatch) the cause."""
    return next((h for h in trusted if h.cause != "hung-peer"), None)
