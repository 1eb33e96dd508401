"""``reproduce``'s command line as one typed :class:`Request`, parsed once.

The options used to travel as the strings the user typed (``"true"``, ``"3"``), turned into numbers and
booleans wherever they were read, with their defaults written in four places; each mode then took 8 to 12
positional arguments cut out of them. Here each option is parsed once (:data:`OPTIONS`: its key, the field it
sets, its parser with the one-line error naming the key and the allowed values), its default is the
:class:`Request` field's (``min_seeds``' is the verdict rule's :data:`normbench.claims.verdict.MIN_SEEDS`,
``bench``'s :data:`normbench.claims.benchmark.DEFAULT`), and the help text's defaults are written from
those fields (:func:`spelled_default`). The modes and :func:`normbench.reproduce.runner.reproduce` take the
request; a ladder's rung is the request with its overrides and directory (:meth:`Request.rung`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from normbench.claims import benchmark
from normbench.claims.registry import SCALES
from normbench.claims.verdict import MIN_SEEDS
from normbench.errors import ConfigError

PARAMS = ("mup", "sp")  # ladder_param=: the scale ladder's parametrization, the first the default


@dataclass(frozen=True)
class Request:
    """One ``reproduce`` call: the claims, this command's options (typed, with their defaults), the Hydra
    overrides the runs train with (jobs=N's launcher included) and the two flags."""

    ids: tuple[str, ...] = ()
    scale: str = "cpu"
    seeds: int | None = None  # None: the claim's own
    out: Path = Path("outputs/reproduce")
    min_seeds: int = MIN_SEEDS
    ladder: bool = False  # the scale ladder (reproduce/ladders/scale.py)
    ladder_param: str = PARAMS[0]  # one of PARAMS: the scale ladder's parametrization
    duration: str = "off"  # off (the command line's false), ladder or branch (reproduce/ladders/duration.py)
    rungs: tuple[float, ...] | None = None  # the duration ladder's tokens per parameter (None: the claim's own)
    lr_ladder: bool = False  # lr=ladder (reproduce/ladders/lr.py)
    jobs: int = 1
    bench: benchmark.Plan | None = benchmark.parse_plan(benchmark.DEFAULT)  # None: bench=off
    dry_run: bool = False
    launch: bool = True  # False: --no-run
    overrides: tuple[str, ...] = ()

    @property
    def kind(self) -> str | None:
        """The ladder this request runs (``duration``, ``ladder`` or ``lr``; :func:`parse` refuses two), or
        None: the claim's verdict."""
        if self.duration != "off":
            return "duration"
        if self.ladder:
            return "ladder"
        return "lr" if self.lr_ladder else None

    def rung(self, extra=(), out: Path | None = None) -> Request:
        """A ladder rung's request: these overrides with ``extra`` after them, in ``out`` (else the same)."""
        return replace(self, overrides=(*self.overrides, *extra), out=self.out if out is None else Path(out))


@dataclass(frozen=True)
class Option:
    """One ``key=value`` option: the :class:`Request` field it sets, and either the words it allows (each
    standing for a value) or a parser (``(key, text, the options parsed before it) -> value``) raising the
    option's one-line error."""

    field: str
    words: dict[str, object] | None = None
    parser: Callable[[str, str, dict], object] | None = None
    hint: str = ""  # said after a word option's allowed words

    def parse(self, key: str, raw: str, parsed: dict) -> object:
        if self.words is None:
            return self.parser(key, raw, parsed)
        if raw not in self.words:
            raise ConfigError(f"{key}={raw} is not allowed; choose one of: {', '.join(self.words)}{self.hint}")
        return self.words[raw]


def _count(least: int) -> Callable[[str, str, dict], int]:
    def parse(key: str, raw: str, _parsed: dict) -> int:
        if not (raw.isdigit() and int(raw) >= least):
            raise ConfigError(f"{key}={raw} must be a whole number (min_seeds >= 2)")
        return int(raw)

    return parse


def _bench(_key: str, raw: str, _parsed: dict) -> benchmark.Plan | None:
    return benchmark.parse_plan(raw)


def _rungs(key: str, raw: str, parsed: dict) -> tuple[float, ...]:
    """Tokens per parameter, and only with a duration ladder (``duration`` is parsed before it)."""
    try:
        values = tuple(float(r) for r in raw.split(","))
    except ValueError:
        values = ()
    if not values or any(not v > 0 for v in values) or parsed.get("duration", Request.duration) == "off":
        raise ConfigError(f"{key}={raw} must be tokens per parameter (e.g. rungs=1,5,20) with duration=")
    return values


def _out(_key: str, raw: str, _parsed: dict) -> Path:
    return Path(raw)


def _same(words) -> dict[str, str]:
    return {w: w for w in words}


# This command's own options (any other key=value is a Hydra override for the runs), in the order they are
# checked: the first bad one is the error.
OPTIONS = {
    "scale": Option("scale", words=_same(SCALES)),
    "seeds": Option("seeds", parser=_count(1)),
    "min_seeds": Option("min_seeds", parser=_count(2)),
    "jobs": Option("jobs", parser=_count(1)),
    "ladder": Option("ladder", words={"true": True, "false": False}),
    "ladder_param": Option("ladder_param", words=_same(PARAMS)),
    "duration": Option("duration", words={"ladder": "ladder", "branch": "branch", "false": "off"}),
    "bench": Option("bench", parser=_bench),
    "rungs": Option("rungs", parser=_rungs),
    "lr": Option("lr_ladder", words={"ladder": True, "false": False}, hint=" (an LR itself is optim.lr=)"),
    "out": Option("out", parser=_out),
}


def spelled_default(key: str) -> str | None:
    """The default of option ``key`` as the command line writes it (None: no value, the claim's own)."""
    opt = OPTIONS[key]
    value = next(f.default for f in fields(Request) if f.name == opt.field)
    if value is None:
        return None
    if opt.words:
        return next(word for word, v in opt.words.items() if v == value)
    if isinstance(value, benchmark.Plan):
        return f"{value.rounds}x{value.steps}"
    return str(value)


def parse(argv: list[str]) -> Request:
    """Flags, this command's options, Hydra overrides and claim ids, each checked: the first bad one is a
    one-line :class:`ConfigError` naming the key and what it allows."""
    ids, raw, overrides, flags = [], {}, [], {}
    for a in argv:
        key, sep, value = a.partition("=")
        if a == "--dry-run":
            flags["dry_run"] = True
        elif a == "--no-run":
            flags["launch"] = False
        elif sep and key in OPTIONS:
            raw[key] = value  # the last one wins
        elif sep:
            overrides.append(a)
        elif a.startswith("-"):
            raise ConfigError(f"unknown flag {a}; see `python -m normbench reproduce --help`")
        else:
            ids.append(a)
    parsed = {}
    for key, opt in OPTIONS.items():
        if key in raw:
            parsed[opt.field] = opt.parse(key, raw[key], parsed)
    req = Request(ids=tuple(ids), overrides=tuple(overrides), **flags, **parsed)
    on = {"ladder": req.ladder, "duration": req.duration != "off", "lr": req.lr_ladder}
    ladders = [key for key, yes in on.items() if yes]
    if len(ladders) > 1:
        raise ConfigError(f"{ladders[0]}= and {ladders[1]}= are two ladders; run them one at a time")
    if not ids:
        raise ConfigError("name a claim (or all); list them with --list")
    return replace(req, overrides=(*overrides, *launcher(req.jobs, overrides)))


def launcher(jobs: int, overrides) -> list[str]:
    """jobs=N (N > 1) as Hydra's joblib launcher running N jobs of a sweep at once (runner.train gives each
    one torch thread); another launcher the user names cannot also take jobs=."""
    if jobs == 1:
        return []
    named = [o for o in overrides if o.split("=", 1)[0] in ("hydra/launcher", "hydra.launcher.n_jobs")]
    if named:
        raise ConfigError(f"jobs={jobs} runs the sweeps through hydra/launcher=joblib; drop {named[0]} or jobs=")
    return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
