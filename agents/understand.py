"""Understanding a request, for every provider: text -> a typed `Request` (act, subject, kind, entities).

Words mean the concepts of agents/vocabulary.py, a typo ("stragler") too (rapidfuzz), but an order is read
only from an exact, uninflected verb with an object in a sentence not asked with "?"; the kind comes from
agents/kinds.py. Entities resolve against the workspace's runs and every scheduler's jobs and nodes (read
through the gated tools): an id whole or by a unique part, "the last"/"yesterday's" by time, "the crash
drill" the only job of that kind. What matches several is `ambiguous`: asked back, never guessed.
"""
from __future__ import annotations

import datetime
import itertools
from contextlib import suppress
from pathlib import Path
from string import ascii_lowercase
from typing import Literal

from pydantic import BaseModel, Field
from rapidfuzz import process
from rapidfuzz.distance import OSA

from trainops.agents import kinds
from trainops.agents.vocabulary import ARMS, FAULT_KINDS, PHRASES, SOP_STEPS, VOCAB
from trainops.run_records import read_drill_record
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext
from trainops.tools.jobs import jobs as job_tools
from trainops.tools.schedulers import session_kinds
from trainops.workspace import runs_dir

Act = Literal["question", "order", "plan"]
_INDEX: dict[str, set[str]] = {}
for _concept, _words in VOCAB.items():
    for _word in _words.split():
        _INDEX.setdefault(_word, set()).add(_concept)
UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60, "mins": 60, "minute": 60,
         "minutes": 60, "m": 60, "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600}
_DURATION_OF = {"save": "save", "checkpoint": "save", "interval": "mtbf", "requeue": "restart", "resume": "restart"}
_NUMBERED = {"rank": "ranks", "ranks": "ranks", "step": "steps", "steps": "steps"}  # the word before -> the list
_COUNTED = {"gpus": "gpus", "gpu": "gpus", "cpus": "cpus", "cpu": "cpus", "jobs": "max_jobs"}  # the word after


def tokens(text: str) -> list[tuple[str, int]]:
    """Each word or id (letters, digits and _ . - / ~; a leading _ or - dropped) and the offset it ends at."""
    out, end = [], 0
    for wordlike, group in itertools.groupby(text, lambda c: c.isalnum() or c in "_.-/~"):
        run = "".join(group)
        end += len(run)
        if wordlike and any(c.isalnum() for c in run):
            out.append((run.lstrip("_-"), end))
    return out


def order_verbs(word: str) -> set[str]:
    """The order verbs a word is: its own vocabulary word, never a near word ("cancle") nor a past tense,
    participle or gerund ("drained", "killing"): those report, they never order."""
    word = word.lower()
    inflected = len(word) >= 5 and word.endswith("ed") or len(word) >= 6 and word.endswith("ing")
    return set() if inflected else _INDEX.get(word, set()) & kinds.ORDER_VERBS


def concepts_of(word: str) -> set[str]:
    """The concepts a word means: its own, else those of the one vocabulary word a typo away."""
    word = word.lower()
    if word in _INDEX:
        return _INDEX[word]
    if len(word) < 5 or any(c.isdigit() for c in word):
        return set()
    near = [w for w in _INDEX if w[0] == word[0] and abs(len(w) - len(word)) <= 2]
    best = process.extractOne(word, near, scorer=OSA.distance, score_cutoff=1 if len(word) < 8 else 2)
    return _INDEX[best[0]] if best else set()


class Job(BaseModel):
    id: str
    name: str = ""
    run: str | None = None
    scheduler: str = "local"
    when: float = 0.0


class World(BaseModel):
    """What the request's words are resolved against: the workspace's runs, the schedulers' jobs and nodes."""
    runs: list[str] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)
    nodes: dict[str, str] = Field(default_factory=dict, description="node name -> the scheduler that lists it")
    drills: list[str] = Field(default_factory=list, description="The runs that hold a drill record.")
    sop_sessions: list[str] = Field(default_factory=list, description="The thread's SOP sessions, oldest first")


class Ambiguity(BaseModel):
    what: str
    said: str
    candidates: list[str]


class Entities(BaseModel):
    jobs: list[str] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    steps: list[int] = Field(default_factory=list)
    durations_s: dict[str, float] = Field(default_factory=dict, description="save, mtbf, restart, in seconds")
    counts: dict[str, int] = Field(default_factory=dict, description="gpus, cpus, jobs named with a number")
    tenant: str | None = None
    priority: str | None = None
    fault: str | None = None
    config: str | None = None
    arms: list[str] = Field(default_factory=list, description="SOP arms (NAME=VALUE) named by their words.")
    sop_steps: list[str] = Field(default_factory=list, description="SOP steps named (S1..S6), in the SOP's order.")
    sop_session: str | None = Field(None, description="The SOP session the thread's own sop_declare started last.")
    scheduler: str = Field("local", description="The scheduler of the first job or node named (its tools' scheduler).")
    baseline_first: bool = Field(True, description="Two runs: False when the first named is compared 'than' "
                                                   "the second (the second is the baseline).")

    @property
    def scheduler_arg(self) -> dict[str, str]:
        """The scheduler argument of a call about these entities: none for a local one (the tools' default)."""
        return {} if self.scheduler == "local" else {"scheduler": self.scheduler}


class Request(BaseModel):
    """A request as the agent understood it; the graph and every provider act on this, not the text."""
    text: str
    act: Act
    kind: str | None
    subject: str | None
    order: str | None = Field(None, description="The tool an order asks for.")
    concepts: list[str] = Field(default_factory=list)
    entities: Entities = Field(default_factory=Entities)
    ambiguous: list[Ambiguity] = Field(default_factory=list)


def observe_world(ctx: CallContext) -> World:
    """The workspace's runs and what each scheduler of the session lists, read through the tools (a failing
    read leaves that part empty)."""
    world = World()
    with suppress(OSError):
        world.runs = sorted(p.name for p in runs_dir().iterdir() if p.is_dir())
        world.drills = [r for r in world.runs if read_drill_record(runs_dir() / r) is not None]
    for kind in session_kinds():
        ref = job_tools.SchedulerRef(scheduler=kind)
        with suppress(Exception):  # the same job listed twice (one injected backend serves every kind) is one
            world.jobs += [Job(id=j.job_id, name=j.name, run=Path(j.run_dir).name if j.run_dir else None,
                               scheduler=j.backend, when=j.submitted_at or j.started_at or 0.0)
                           for j in invoke(job_tools.list_jobs, ref, ctx).jobs
                           if not any((j.job_id, j.backend) == (k.id, k.scheduler) for k in world.jobs)]
        with suppress(Exception):
            world.nodes = {n.name: kind for n in invoke(job_tools.list_nodes, ref, ctx).nodes} | world.nodes
    return world


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def _run_time(run: str) -> str:
    return "".join(c for c in run if c.isdigit())[:14]


def _day(job: Job | None, run: str | None) -> str:
    if job is not None and job.when:
        return datetime.datetime.fromtimestamp(job.when, datetime.timezone.utc).strftime("%Y%m%d")
    return _run_time(run or "")[:8]


class _Reader:
    """One pass over the request's words: concepts, numbers and ids, in order."""
    def __init__(self, text: str, world: World):
        spans = tokens(text)
        self.words = [word.rstrip(".-/") for word, _ in spans]
        self.low = [w.lower() for w in self.words]
        self.world, self.found = world, Entities()
        self.concepts: list[set[str]] = [set() for _ in self.words]
        self.ambiguous: list[Ambiguity] = []
        self.used: set[int] = set()
        self.led: dict[int, set[str]] = {}  # the concepts of a phrase that starts at the word ("go on")
        # the mark that follows each word, if any: a sentence's (SENTENCE_MARKS), a clause's (":", ",")
        self.stops = ["." if word.endswith(".") else text[end:].lstrip(" ")[:1] for word, end in spans]

    def _add(self, kind: str, value: str) -> None:
        bucket = getattr(self.found, kind)
        job = next((j for j in self.world.jobs if j.id == value), None) if kind == "jobs" else None
        if kind != "runs" and not (self.found.jobs or self.found.nodes):  # the first job or node named: its own
            self.found.scheduler = job.scheduler if job else self.world.nodes.get(value, "local")
        if value not in bucket:
            bucket.append(value)
        if job is not None and job.run and job.run not in self.found.runs:
            self.found.runs.append(job.run)

    def _pick(self, hits: list[tuple[str, str]], what: str, said: str, shown: list[str] | None = None) -> bool:
        """One referent the words match: take it; several: ask which, never a guess. True when any matched."""
        if len(hits) == 1:
            self._add(*hits[0])
        elif hits:
            self.ambiguous.append(Ambiguity(what=what, said=said, candidates=(shown or [v for _, v in hits])[:8]))
        return bool(hits)

    def _ids(self, word: str, before: str) -> bool:
        """Resolve one word as a job, run or node id by the first lookup that applies and matches; True when one
        did (of several referents, _pick asks which)."""
        jobs, runs, nodes, part = self.world.jobs, self.world.runs, self.world.nodes, word.lower()
        short = {n.split(".")[0].lower(): n for n in nodes}
        exact = [j for j in jobs if j.id == word and before != "run"]  # the same id on two schedulers: ask which
        partial = (any(c.isdigit() for c in word) or "-" in word) and not (
            word.isdigit() and len(word) < 5 and before not in ("job", "run"))  # a unique part of a long id
        hit_jobs = [j for j in jobs if before != "run" and len(part) >= 3 and part in j.id.lower()]
        hit_runs = [r for r in runs if before != "job" and len(part) >= 3 and part in r.lower()
                    and not any(j.run == r for j in hit_jobs)]
        lookups = (  # (applies, the referents it matches, what is asked back, as said, the candidates shown)
            (before in ("node", "host") and word.isdigit(), [("nodes", n) for n in sorted(nodes) if "".join(  # node 3
                filter(str.isdigit, n.split(".")[0])).lstrip("0") == word.lstrip("0")], "node", f"{before} {word}",
             None),
            (part in short and before != "job", [("nodes", short.get(part))], "node", word, None),
            (True, [("jobs", j.id) for j in exact], "job", word, [f"{j.scheduler} job {j.id}" for j in exact]),
            (word in runs, [("runs", word)], "run", word, None),
            (partial, [("jobs", j.id) for j in hit_jobs] + [("runs", r) for r in hit_runs],
             before if before in ("job", "run") else "job or run", word, None),
            (partial and before in ("job", "run", "node", "host"),  # named but unknown here: the tools will say so
             [({"job": "jobs", "run": "runs"}.get(before, "nodes"), word)], before, word, None))
        return any(applies and self._pick(referents, what, said, shown)
                   for applies, referents, what, said, shown in lookups)

    def read(self) -> None:
        low, concepts = self.low, self.concepts
        for i in range(len(low)):
            for phrase, concept in PHRASES.items():
                if tuple(low[i:i + len(phrase)]) == phrase:
                    self.led.setdefault(i, set()).add(concept)
                    for j in range(i, i + len(phrase)):
                        concepts[j].add(concept)
        for i, word in enumerate(self.words):
            before = low[i - 1] if i else ""
            after = low[i + 1] if i + 1 < len(low) else ""
            value = _number(low[i])
            head = low[i].rstrip(ascii_lowercase)  # "5-minute", "3h": a number glued to its unit
            if low[i][len(head):] in UNITS and (glued := _number(head.rstrip("-"))) is not None:
                value, after = glued, low[i][len(head):]
            whole = value is not None and value.is_integer()
            if word.endswith(".toml"):
                self.found.config = word
            elif before == "tenant" and not word.isdigit():
                self.found.tenant = word
            elif value is not None and after in UNITS:
                self._duration(i, value * UNITS[after])
            elif whole and before in _NUMBERED:
                getattr(self.found, _NUMBERED[before]).append(int(value))
            elif whole and after in _COUNTED:
                self.found.counts[_COUNTED[after]] = int(value)
            elif not self._ids(word, before):
                concepts[i] |= concepts_of(word)
                if word.lower() in ("low", "normal", "high") and after == "priority":
                    self.found.priority = word.lower()
                continue
            self.used.add(i)

    def _duration(self, i: int, seconds: float) -> None:
        near = range(max(0, i - 6), min(i + 4, len(self.low)))
        window = set().union(*(self.concepts[j] | concepts_of(self.low[j]) for j in near))
        key = next((v for k, v in _DURATION_OF.items() if k in window and v not in self.found.durations_s), None)
        if key:
            self.found.durations_s[key] = seconds


def _by_reference(reader: _Reader, seen: set[str]) -> None:
    """'the last run', "yesterday's job", 'the crash drill': a job or run the words pick without an id."""
    world, found = reader.world, reader.found
    if found.jobs or found.runs or not ({"job", "run", "drill"} & seen or found.fault):
        return
    pool = world.jobs
    if "drill" in seen:  # a drill: a job whose run holds a drill record, or a job the drill command named
        pool = [j for j in pool if j.run in world.drills or j.name.lower().startswith("drill")]
    if found.fault:  # the jobs of that kind; of several, those that left a run
        pool = [j for j in pool if found.fault in j.name.lower() or found.fault in j.id.lower()]
        pool = [j for j in pool if j.run] or pool
    said, day = next((when for when in ("yesterday", "today") if when in seen), ""), ""
    if said:
        now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=int(said == "yesterday"))
        day = now.strftime("%Y%m%d")
        pool = [j for j in pool if _day(j, j.run) == day]
    runs = sorted({r for r in world.runs if (r in {j.run for j in pool} if pool else
                                               not day or _day(None, r) == day)}, key=_run_time)
    if day and not pool and not runs:  # nothing from that day: say so, never fall back to the latest overall
        reader.ambiguous.append(Ambiguity(what="job or run from " + said, said=said, candidates=[]))
        return
    if "latest" in seen and pool:
        pool = [max(pool, key=lambda j: (j.when, j.id))]
    if len(pool) == 1:
        reader._add("jobs", pool[0].id)
    elif not pool and runs and ({"run", "latest"} <= seen or len(runs) == 1 and {"run", "latest"} & seen
                                  or day and "run" in seen and len(runs) == 1):
        found.runs.append(runs[-1])
    elif pool:
        reader.ambiguous.append(Ambiguity(what="job", said=" ".join(sorted(seen & {"latest", "yesterday", "drill"}))
                                          or (found.fault or "the job"), candidates=[j.id for j in pool][-8:]))


# what may follow an order's verb as its object: a pronoun or determiner, a word for what is acted on
OBJECT_WORDS = frozenset("it that this these those them the a an my our their its all every each both any some "
                         "everything tenant".split())
OBJECT_CONCEPTS = frozenset({"job", "jobs", "node", "nodes", "run", "step", "rank", "checkpoint", *FAULT_KINDS})
# what, after the word that follows a verb, makes the two a noun ("kill count on", "cordon status of")
PREPOSITIONS = frozenset("on of for in at from with about since per by over under after before during yet already "
                         "so".split())
PLEASE, MODALS = frozenset({"please", "pls", "plz", "kindly"}), frozenset({"can", "could", "would", "will"})
SENTENCE_MARKS = (".", "?", "!", ";")


def _order(reader: _Reader, seen: set[str]) -> str | None:
    """The action an imperative clause orders: its first word past the politeness is an action verb with
    its object (or one that orders alone: "go on"), in a sentence not asked ("?") unless as a request is."""
    for clause in _clauses(reader):
        lead = next((i for i in clause if not reader.concepts[i] or reader.concepts[i] - {"politeness"}), None)
        if lead is None:
            continue
        verbs = order_verbs(reader.low[lead]) | reader.led.get(lead, set()) & kinds.BARE_VERBS  # "go on"
        bare = not _has_object(reader, lead, clause)  # then only a verb that orders standing alone
        if not verbs or _asks(reader, clause) or bare and not verbs & kinds.BARE_VERBS:
            continue
        here = set().union(*(reader.concepts[i] for i in clause))
        return kinds.ordered_tool(verbs, here | seen, reader.found, bare)
    return None


def _asks(reader: _Reader, clause: list[int]) -> bool:
    """The clause's sentence ends with '?' and neither it nor the clause opens with a request form."""
    end = next((j for j in range(clause[-1], len(reader.stops)) if reader.stops[j] in SENTENCE_MARKS), None)
    if end is None or reader.stops[end] != "?":
        return False
    start = next((j + 1 for j in range(clause[0] - 1, -1, -1) if reader.stops[j] in SENTENCE_MARKS), 0)
    low = reader.low  # a request form opens it: 'please', 'pls', 'can/could/would/will you'
    return not any(low[i] in PLEASE or low[i] in MODALS and low[i + 1:i + 2] in (["you"], ["u"])
                   for i in (clause[0], start))


def _has_object(reader: _Reader, verb: int, clause: list[int]) -> bool:
    """The verb is followed in its clause by what it acts on: an id, a pronoun, a determiner, an object word,
    or a word not making a noun compound with it (then a preposition or nothing: "kill count on", "stop.")."""
    nxt = verb + 1
    if nxt not in clause:
        return False
    return bool(nxt in reader.used or reader.low[nxt] in OBJECT_WORDS or reader.concepts[nxt] & OBJECT_CONCEPTS
                or any(c.isdigit() or c == "-" for c in reader.low[nxt])
                or nxt + 1 in clause and reader.low[nxt + 1] not in PREPOSITIONS)


def _clauses(reader: _Reader) -> list[list[int]]:
    """The clauses, as word indexes: split at a sentence mark, comma or colon, and before then/and/so/but."""
    out: list[list[int]] = [[]]
    for i, word in enumerate(reader.low):
        if word in ("then", "and", "so", "but") and out[-1]:
            out.append([])
        out[-1].append(i)
        if reader.stops[i] in SENTENCE_MARKS + (":", ","):
            out.append([])
    return [clause for clause in out if clause]


def understand(text: str, world: World | None = None) -> Request:
    """The request as the agent acts on it (see the module's docstring)."""
    reader = _Reader(text, world or World())
    reader.read()
    seen = set().union(*reader.concepts) if reader.concepts else set()
    reader.found.fault = next((f for c, f in FAULT_KINDS.items() if c in seen), None)
    if "node" in seen and reader.found.fault == "crash":
        reader.found.fault = "node-crash"
    _by_reference(reader, seen)
    found = reader.found
    found.arms, found.sop_steps = [a for a in ARMS if a in seen], [s for s in SOP_STEPS if s in seen]
    found.sop_session = reader.world.sop_sessions[-1] if reader.world.sop_sessions else None
    if len(found.runs) == 2:
        positions = [i for i, w in enumerate(reader.words) if any(r in w for r in found.runs[1:])]
        found.baseline_first = not any(w.lower() == "than" for w in reader.words[: positions[0]]) if positions else True
    order = _order(reader, seen)
    kind = kinds.choose(order, seen, found)
    return Request(text=text, act=kind.act if kind else ("order" if order else "question"),
                   kind=kind.name if kind else None, subject=kind.subject if kind else None, order=order,
                   concepts=sorted(seen), entities=found, ambiguous=reader.ambiguous)
