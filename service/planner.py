"""Which candidates to evaluate next, and when the bisection is over.

Pure: the local `bisect-cli run` loop and the service's scheduler hand the same
snapshot of candidates to `plan` and get the same answer, so tests can pin the
exact order in which a search visits releases.

Vocabulary. Candidates are ordered oldest to newest. Index 0 is expected to be
in the OLD state and the last index in the NEW state:

- regression (default): OLD = memory stays bounded (clean or plateau), NEW = leak;
- find-fix: OLD = leak, NEW = bounded.

The search looks for the boundary pair (last OLD, first NEW). Everything else a
candidate can be (untestable, skip, error, inconclusive, flaky) is *unjudgeable*:
never blamed and, as with `git bisect skip`, stepped around.

Rules, in the order `plan` applies them:

1. Bounds. A bound judged in the wrong state ends the search (`bounds_failed`);
   an untestable, skipped or erroring bound ends it with `error`; an inconclusive
   or flaky bound with `inconclusive`. Results of interior candidates evaluated
   speculatively are ignored then. Unknown bounds are scheduled before anything
   else, the good/old bound first, so one free slot tests 0, then the last
   index, then bisects; two slots test both bounds at once.
2. Interval. first_new = the lowest index in the NEW state; last_old = the
   highest index below it in the OLD state. An unknown bound counts as if it
   were in its expected state (it is either that or the search stops), which is
   what lets free slots speculate inside the range while bounds are running.
   Inconsistent data (an OLD candidate above a NEW one) is thus resolved
   deterministically towards the first NEW candidate.
3. k-section. The candidates that can still move the boundary are the unknown
   testable ones inside the open interval (last_old, first_new). Slots left after
   the bounds cut that list into nearly equal parts, by rank among those unknowns
   (not by raw index), so unjudgeable candidates are stepped around by
   construction and untestable ones are never picked. Candidates already running
   count as cuts already made: new points go to the largest remaining gaps.
   Ties prefer the lower index.
4. Confirm. Once nothing unknown is left inside the interval, last_old and
   first_new must each have two evaluations (a bound's first evaluation counts),
   so each is re-run once. A re-run that disagrees makes the candidate flaky,
   i.e. unjudgeable, and the search goes on from the new interval.
5. Outcome. Only unjudgeable candidates (or none) between a confirmed pair:
   `found` when none, `inconclusive` listing them when some.

`Plan(run=(), outcome=None)` means: wait for running evaluations. An outcome can
be returned while evaluations outside the interval still run; under the
monotone model they cannot change it, and the caller should cancel them.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from service.verdicts import Verdict


@dataclass(frozen=True)
class ReleaseState:
    """What the planner needs to know about one release of the range."""

    version: str
    testable: bool = True  # False: no installable distribution; never tested, never blamed
    verdicts: tuple[Verdict, ...] = ()  # one per completed evaluation (trials aggregated)
    running: bool = False  # an evaluation is in progress


@dataclass(frozen=True)
class Outcome:
    """How the search ended."""

    status: Literal["found", "bounds_failed", "inconclusive", "error"]
    last_old: int | None  # regression: last good; find-fix: last leaking
    first_new: int | None  # regression: first bad; find-fix: first fixed
    skipped: tuple[int, ...]  # unjudgeable indices strictly between last_old and first_new
    message: str  # one clear sentence


@dataclass(frozen=True)
class Plan:
    """The planner's answer: what to run next, or how it ended."""

    run: tuple[int, ...]  # candidate indices to evaluate next, in priority order
    outcome: Outcome | None  # set when the search is over


class _Kind(Enum):
    UNKNOWN = "unknown"
    OLD = "old"
    NEW = "new"
    UNJUDGEABLE = "unjudgeable"


@dataclass(frozen=True)
class _State:
    kind: _Kind
    # What to print: the verdict(s) for judged candidates, the reason otherwise
    # ("untestable", "skip", "error", "inconclusive", "flaky").
    label: str


def _verdict_class(verdict: Verdict) -> str:
    # clean and plateau both mean "bounded": a clean run and a plateau run of the
    # same release agree with each other.
    return "bounded" if verdict.bounded else verdict.value


def _state(candidate: ReleaseState, find_fix: bool) -> _State:
    if not candidate.testable:
        return _State(_Kind.UNJUDGEABLE, "untestable")
    if not candidate.verdicts:
        return _State(_Kind.UNKNOWN, "unknown")
    classes = {_verdict_class(v) for v in candidate.verdicts}
    if len(classes) > 1:
        # Any disagreement between evaluations (leak vs bounded, or a judged
        # verdict vs a skip/error/inconclusive re-run) means the candidate did
        # not reproduce its own verdict: it cannot be blamed either way.
        return _State(_Kind.UNJUDGEABLE, "flaky")
    (cls,) = classes
    label = ", ".join(dict.fromkeys(v.value for v in candidate.verdicts))
    if cls == "leak":
        return _State(_Kind.NEW if not find_fix else _Kind.OLD, label)
    if cls == "bounded":
        return _State(_Kind.OLD if not find_fix else _Kind.NEW, label)
    return _State(_Kind.UNJUDGEABLE, cls)


def _outcome(
    status: Literal["found", "bounds_failed", "inconclusive", "error"],
    message: str,
    last_old: int | None = None,
    first_new: int | None = None,
    skipped: tuple[int, ...] = (),
) -> Plan:
    return Plan(run=(), outcome=Outcome(status, last_old, first_new, skipped, message))


def _bound_problem(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool
) -> Plan | None:
    """The outcome when a bound cannot anchor the search, else None."""
    last = len(candidates) - 1
    good, bad = candidates[0].version, candidates[last].version
    good_wrong = states[0].kind is _Kind.NEW
    bad_wrong = states[last].kind is _Kind.OLD

    if good_wrong and bad_wrong:
        # Both ends inverted: almost always the wrong mode, so say so.
        if find_fix:
            msg = (
                f"old bound {good} does not leak ({states[0].label}) and new bound {bad} leaks: "
                "this looks like a regression, not a fix"
            )
        else:
            msg = (
                f"good bound {good} leaks and bad bound {bad} does not "
                f"({states[last].label}): this looks like a fix; use find-fix"
            )
        return _outcome("bounds_failed", msg)

    # A bound judged in the wrong state is a definite answer: it outranks a bound
    # that could not be judged at all.
    if good_wrong:
        if find_fix:
            msg = f"old bound {good} does not leak ({states[0].label}): find-fix needs it to leak"
        else:
            msg = f"good bound {good} leaks: it must not"
        return _outcome("bounds_failed", msg)
    if bad_wrong:
        if find_fix:
            msg = f"new bound {bad} still leaks: nothing to bisect"
        else:
            msg = f"bad bound {bad} does not leak ({states[last].label}): nothing to bisect"
        return _outcome("bounds_failed", msg)

    return _unjudgeable_bound(candidates, states, find_fix)


def _unjudgeable_bound(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool
) -> Plan | None:
    """The outcome when a bound cannot be judged at all; the good/old bound is reported first."""
    last = len(candidates) - 1
    old_name, new_name = ("old bound", "new bound") if find_fix else ("good bound", "bad bound")
    for index, name in ((0, old_name), (last, new_name)):
        state, version = states[index], candidates[index].version
        if state.kind is not _Kind.UNJUDGEABLE:
            continue
        if state.label == "untestable":
            why = "it has no installable distribution"
        elif state.label == "skip":
            why = "its script skipped it (exit 125 or no buildable environment)"
        elif state.label == "error":
            why = "its evaluation failed (crash or infrastructure error)"
        elif state.label == "inconclusive":
            return _outcome(
                "inconclusive",
                f"{name} {version} is inconclusive: the classifier could not tell whether it leaks",
            )
        else:
            verdicts = ", ".join(v.value for v in candidates[index].verdicts)
            return _outcome(
                "inconclusive", f"{name} {version} is flaky: its evaluations disagree ({verdicts})"
            )
        return _outcome("error", f"{name} {version} cannot be tested: {why}")
    return None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _section(unknowns: Sequence[int], running: set[int], points: int) -> list[int]:
    """Pick up to `points` of the non-running `unknowns`, cutting them evenly.

    `unknowns` is the ordered list of unknown testable indices inside the open
    interval; running ones split it into segments (cuts already made).
    """
    segments: list[list[int]] = [[]]
    for index in unknowns:
        if index in running:
            segments.append([])
        else:
            segments[-1].append(index)
    segments = [s for s in segments if s]
    placed = [0] * len(segments)
    for _ in range(points):
        # Greedy on the largest part left: with p points in a segment of u
        # unknowns the largest part holds ceil((u - p) / (p + 1)) of them. The
        # strict ">" keeps the leftmost segment on ties.
        best, best_part = -1, 0
        for i, segment in enumerate(segments):
            u, p = len(segment), placed[i]
            if p < u and _ceil_div(u - p, p + 1) > best_part:
                best, best_part = i, _ceil_div(u - p, p + 1)
        if best < 0:
            break  # every unknown is already picked
        placed[best] += 1
    picks: list[int] = []
    for segment, p in zip(segments, placed, strict=True):
        u = len(segment)
        # Rank j * (u + 1) // (p + 1) (1-based) splits u into p + 1 near-equal
        # parts; flooring prefers the lower index when two ranks split equally.
        # The step (u + 1) / (p + 1) >= 1, so the ranks are distinct; p == u
        # picks every one.
        picks.extend(segment[j * (u + 1) // (p + 1) - 1] for j in range(1, p + 1))
    return sorted(picks)


def _final(
    candidates: Sequence[ReleaseState],
    states: list[_State],
    last_old: int,
    first_new: int,
    find_fix: bool,
    confirmed: bool,
) -> Plan:
    old_word, new_word = ("last leaking", "first fixed") if find_fix else ("last good", "first bad")
    old_v, new_v = candidates[last_old].version, candidates[first_new].version
    between = tuple(range(last_old + 1, first_new))
    if not between:
        how = "each confirmed by a second evaluation" if confirmed else "not re-run to confirm"
        return _outcome(
            "found", f"{new_word} is {new_v} and {old_word} is {old_v}, {how}", last_old, first_new
        )
    versions = ", ".join(candidates[i].version for i in between)
    reasons = ", ".join(f"{candidates[i].version} ({states[i].label})" for i in between)
    return _outcome(
        "inconclusive",
        f"{new_word} is one of {versions}, {new_v}: {reasons} could not be judged, "
        f"and {old_word} is {old_v}",
        last_old,
        first_new,
        between,
    )


def plan(
    candidates: Sequence[ReleaseState],
    slots: int,
    *,
    find_fix: bool = False,
    confirm: bool = True,
) -> Plan:
    """Decide what to evaluate next, or how the search ended.

    `slots` is how many evaluations may run at once in total; running
    candidates occupy slots. Never returns a running candidate, nor more
    candidates than free slots.
    """
    if slots < 0:
        raise ValueError(f"slots must be >= 0, got {slots}")
    n = len(candidates)
    if n < 2:
        return _outcome("error", f"need at least two candidates (a good and a bad bound), got {n}")
    last = n - 1
    states = [_state(c, find_fix) for c in candidates]
    if (problem := _bound_problem(candidates, states, find_fix)) is not None:
        return problem

    running = {i for i, c in enumerate(candidates) if c.running}
    free = max(0, slots - len(running))
    run: list[int] = []

    # Bounds first, good/old before bad/new: with one slot the cheap
    # "good must not leak" check comes before anything else.
    for bound in (0, last):
        if states[bound].kind is _Kind.UNKNOWN and bound not in running and len(run) < free:
            run.append(bound)
    bounds_known = all(states[b].kind is not _Kind.UNKNOWN for b in (0, last))

    # An unknown bound stands in for its expected state (rule 2 in the module
    # docstring): if it turns out wrong, the search stops anyway.
    first_new = min(
        (i for i, s in enumerate(states) if s.kind is _Kind.NEW or i == last), default=last
    )
    last_old = max(i for i in range(first_new) if states[i].kind is _Kind.OLD or i == 0)
    unknowns = [i for i in range(last_old + 1, first_new) if states[i].kind is _Kind.UNKNOWN]
    run.extend(_section(unknowns, running, free - len(run)))
    if unknowns or not bounds_known:
        # Still bisecting, or waiting for bounds / running interior candidates.
        return Plan(run=tuple(run), outcome=None)

    if confirm:
        pending = [i for i in (last_old, first_new) if len(candidates[i].verdicts) < 2]
        if pending:
            run.extend(i for i in pending if i not in running)
            return Plan(run=tuple(run[:free]), outcome=None)
    return _final(candidates, states, last_old, first_new, find_fix, confirm)
