"""Which dependency: the smallest set of package changes that makes the good environment leak.

Pure, like engine/planner.py: the scheduler hands `step` every mix judged so far and gets
back what to test next, or the answer, so the local loop and the service walk the same path
and tests can pin the exact mixes a search visits.

Vocabulary. A *change* is one package whose version differs between the good environment
(--from) and the bad one (--to), added or removed included. A *configuration* is the set of
change names applied to the good environment (`mix` builds its pins); the empty set is the
good environment and the full set the bad one. Each configuration's outcome is LEAK, CLEAN
or UNRESOLVED: a mix uv cannot resolve, one that does not build, or one whose verdict is not
decisive. UNRESOLVED is never blamed (Zeller and Hildebrandt's "?" outcome).

Rules, in the order `step` applies them:

1. Ends. No change at all: `Failed`. Otherwise the empty and the full configuration are
   asked for first (both at once with two slots). The good environment must be CLEAN and
   the bad one LEAK; anything else is `Failed`, saying which end and why (`bounds_failed`
   when an end was judged and is in the wrong state, not merely unjudgeable).
2. ddmin (Zeller and Hildebrandt 2002), replayed from the start over what is known. The
   current set starts as every change, in name order, with granularity n = 2. Split it into
   n nearly equal parts; test each part: the first that LEAKs becomes the current set and
   n = 2. Else test each complement (the current set minus one part): the first that LEAKs
   becomes the current set and n = max(n - 1, 2). Else, if n is below the set's size,
   n = min(2n, size) and split again; else the set is minimal. The first configuration of
   this walk whose outcome is unknown is asked for; with more slots the further tests of
   the same round come with it, in the order the walk would test them (speculation: a
   LEAK among the earlier ones makes the later ones unneeded). Configurations already
   running are never asked again; when every one the walk needs now is running,
   `Need(())` says wait.
3. Minimal. The final set is 1-minimal when every configuration that drops one of its
   changes is CLEAN: a set of one is certified by the good environment itself; a larger
   one by the complements of the last round, which are its one-element removals. Any that
   was UNRESOLVED leaves the set uncertified, and the answer says how many.

Trial bound. With one slot each distinct configuration is tested once: the two ends, then
ddmin's tests. For n changes `step` asks for at most `worst_case_tests(n)` configurations,
the ends included: Zeller's bound of n^2 + 3n tests for ddmin, plus the two ends. Exact
worst cases for small n, by exhaustive search over every outcome assignment
(tests/test_ddmin.py), are in `EXACT_WORST` and are what `worst_case_tests` returns there.
A single culprit among n changes takes about 2 log2(n) + 2 mixes: the bisection of a
release range, over packages.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from packaging.utils import canonicalize_name


@dataclass(frozen=True)
class Change:
    """One package that differs between the two environments (None: absent on that side)."""

    name: str
    old: str | None
    new: str | None

    def describe(self) -> str:
        if self.old is None:
            return f"{self.name} added at {self.new}"
        if self.new is None:
            return f"{self.name} {self.old} removed"
        return f"{self.name} {self.old} -> {self.new}"

    def as_new(self) -> str:
        return f"{self.name} removed" if self.new is None else f"{self.name} {self.new}"


class Outcome(Enum):
    LEAK = "leak"
    CLEAN = "clean"
    UNRESOLVED = "unresolved"


Config = frozenset[str]


@dataclass(frozen=True)
class Need:
    """Test these configurations now; empty: wait for the running ones."""

    configs: tuple[Config, ...]


@dataclass(frozen=True)
class Minimal:
    culprits: tuple[Change, ...]  # in name order
    certified: bool  # every one-element removal was tested CLEAN
    message: str
    untested: tuple[Config, ...] = ()  # the removals that were UNRESOLVED


@dataclass(frozen=True)
class Failed:
    message: str
    # Both ends were judged and one is in the wrong state (the good one leaks, the bad one
    # is clean): the job's bounds failed, not the search. Left out of ==: the message
    # already says which end and why.
    bounds_failed: bool = field(default=False, compare=False)


def changes(good: Mapping[str, str], bad: Mapping[str, str]) -> list[Change]:
    """What differs between two environments ({name: version}), in name order."""
    old = {canonicalize_name(k): v for k, v in good.items()}
    new = {canonicalize_name(k): v for k, v in bad.items()}
    return [
        Change(name, old.get(name), new.get(name))
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def mix(
    good: Mapping[str, str], bad: Mapping[str, str], applied: Collection[str]
) -> dict[str, str]:
    """The good environment with the `applied` changes' new versions (removals removed)."""
    pins = {canonicalize_name(k): v for k, v in good.items()}
    new = {canonicalize_name(k): v for k, v in bad.items()}
    known = {c.name for c in changes(good, bad)}
    for name in applied:
        if name not in known:
            raise ValueError(f"unknown change: {name}")
        if name in new:
            pins[name] = new[name]
        else:
            pins.pop(name, None)
    return dict(sorted(pins.items()))


# Measured by exhaustive search over LEAK/CLEAN/UNRESOLVED answers (tests/test_ddmin.py
# repeats it up to 4; 5 takes a minute): n^2 - n + 2 so far, well under the bound.
EXACT_WORST: Mapping[int, int] = {1: 2, 2: 4, 3: 8, 4: 14, 5: 22}


def worst_case_tests(n: int) -> int:
    """The most configurations `step` asks for with `n` changes, the two ends included."""
    if n <= 0:
        return 0
    return EXACT_WORST.get(n, n * n + 3 * n + 2)


def _split(items: Sequence[str], n: int) -> list[tuple[str, ...]]:
    size, extra = divmod(len(items), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        parts.append(tuple(items[start:end]))
        start = end
    return parts


class _Unknown(Exception):
    """The walk needs outcomes it does not have: these configurations, in test order."""

    def __init__(self, configs: list[Config]) -> None:
        self.configs = configs


def _round(current: tuple[str, ...], n: int) -> list[Config]:
    """The configurations one ddmin round tests, in order: the parts, then complements."""
    parts = [frozenset(p) for p in _split(current, n)]
    whole = frozenset(current)
    complements = [whole - p for p in parts] if n > 2 else []
    return parts + complements


def _walk(names: tuple[str, ...], known: Mapping[Config, Outcome]) -> tuple[str, ...]:
    """ddmin from the start over `known`; raises _Unknown where it needs more."""
    current, n = names, 2
    while len(current) > 1:
        tests = _round(current, n)
        for index, config in enumerate(tests):
            outcome = known.get(config)
            if outcome is None:
                raise _Unknown(tests[index:])
            if outcome is Outcome.LEAK:  # a part: start over at 2; a complement: n - 1
                n = 2 if index < n else max(n - 1, 2)
                current = tuple(sorted(config))
                break
        else:
            if n >= len(current):
                return current
            n = min(2 * n, len(current))
    return current


def _certificate(culprits: tuple[str, ...], known: Mapping[Config, Outcome]) -> list[Config]:
    """The one-element removals of the answer that were not judged CLEAN (ddmin's last
    round tested each of them: a set of one by the good environment itself)."""
    whole = frozenset(culprits)
    return [whole - {name} for name in culprits if known.get(whole - {name}) is not Outcome.CLEAN]


def _message(culprits: Sequence[Change]) -> str:
    if len(culprits) == 1:
        return f"leaks when {culprits[0].describe()} is applied"
    named = [c.as_new() for c in culprits]
    if len(named) == 2:
        return f"leaks only when both {named[0]} and {named[1]} are new"
    return f"leaks only when {', '.join(named[:-1])} and {named[-1]} are all new"


def _ends(everything: Config, known: Mapping[Config, Outcome]) -> Failed | list[Config]:
    """Rule 1: the ends that still need testing, or why the search cannot start."""
    good, bad = known.get(frozenset()), known.get(everything)
    if good is Outcome.LEAK:
        return Failed("the good environment leaks too: nothing to minimize", bounds_failed=True)
    if bad is Outcome.CLEAN:
        return Failed("the bad environment does not leak: nothing to minimize", bounds_failed=True)
    why = "it did not build or its verdict was inconclusive"
    if good is Outcome.UNRESOLVED:
        return Failed(f"the good environment could not be judged: {why}")
    if bad is Outcome.UNRESOLVED:
        return Failed(f"the bad environment could not be judged: {why}")
    return [c for c, o in ((frozenset(), good), (everything, bad)) if o is None]


def step(
    changes: Sequence[Change],
    known: Mapping[Config, Outcome],
    slots: int = 1,
    *,
    running: Collection[Config] = (),
) -> Need | Minimal | Failed:
    """What to test next, or the minimal set (the module docstring has the rules)."""
    if not changes:
        return Failed("the two environments are the same: nothing changed")
    names = tuple(sorted(c.name for c in changes))
    everything = frozenset(names)
    ends = _ends(everything, known)
    if isinstance(ends, Failed):
        return ends
    try:
        if ends:
            raise _Unknown(ends)
        found = _walk(names, known)
    except _Unknown as unknown:
        free = [c for c in dict.fromkeys(unknown.configs) if c not in known and c not in running]
        return Need(tuple(free[: max(slots - len(running), 0)]))
    culprits = tuple(sorted((c for c in changes if c.name in found), key=lambda c: c.name))
    untested = tuple(_certificate(found, known))
    message = _message(culprits)
    if untested:
        message += f" (not certified 1-minimal: {len(untested)} smaller mixes could not be judged)"
    return Minimal(culprits, not untested, message, untested)
