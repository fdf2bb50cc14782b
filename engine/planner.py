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
never blamed and, as with `git bisect skip`, stepped around. A *transition* is two
judged candidates in different states with only unjudgeable or untested ones
between them; a range is *monotone* when it has one.

Rules, in the order `plan` applies them:

1. Bounds. A bound judged in the wrong state ends the search (`bounds_failed`);
   an untestable, skipped or erroring bound ends it with `error` (a skip says
   which reason it was, given by the caller: `ReleaseState.why`, e.g. the script
   exited 125, uv found no resolution, the repro cannot run on it); an
   inconclusive or flaky bound with `inconclusive`. Results of interior
   candidates evaluated speculatively are ignored then. Unknown bounds are
   scheduled before anything else, the good/old bound first, so one free slot
   tests 0, then the last index, then bisects; two slots test both bounds at once.
2. Interval. first_new = the lowest index in the NEW state; last_old = the
   highest index below it in the OLD state. An unknown bound counts as if it
   were in its expected state (it is either that or the search stops), which is
   what lets free slots speculate inside the range while bounds are running.
   Inconsistent data (an OLD candidate above a NEW one) is thus resolved
   deterministically towards the first NEW candidate, and said out loud (rule 6).
3. k-section. The candidates that can still move the answer are the unknown
   testable ones inside the open interval (last_old, first_new); with
   `all_transitions`, every unknown testable candidate of the range. Slots left
   after the bounds cut that list into nearly equal parts, by rank among those
   unknowns (not by raw index), so unjudgeable candidates are stepped around by
   construction and untestable ones are never picked. Candidates already running
   count as cuts already made (with `all_transitions` evaluated ones too: the
   points go to the largest untested gaps, so a partial map is spread evenly):
   new points go to the largest remaining gaps. Ties prefer the lower index.
4. Confirm. Once nothing unknown is left there, both sides of the boundary pair
   (with `all_transitions`: of every transition) must have two evaluations (a
   bound's first evaluation counts), so each is re-run once. A re-run that
   disagrees makes the candidate flaky, i.e. unjudgeable, and the search goes on
   from the new interval (the transitions are read again without it).
5. Witness (unless `all_transitions`, or `witness=False`: the scheduler's commit
   stage, whose candidates are each built from source). One evaluation on the NEW
   side, strictly between first_new and the last index: the untested testable
   candidate in the middle of the largest stretch of untested ones there (cut
   by evaluated and running candidates; lower middle, and the lower stretch, on
   ties). That side is where a contradiction changes what the answer means:
   the release the user's new bound got its state from may be a later one. It
   runs in the slots the confirmations leave (after them with one slot); none
   when nothing there is untested. It cannot move the answer (it lies above
   first_new), only show that the range is not monotone. Stateless: a
   candidate already evaluated (or running) that is the witness of the snapshot
   without it counts as the witness, so a snapshot never asks for a second one;
   the cost is one evaluation at most (again only when a flaky confirmation
   moves the pair). While any such candidate still runs, the outcome waits.
6. Outcome. Only unjudgeable candidates (or none) between a confirmed pair:
   `found` when none, `inconclusive` listing them when some. The outcome also
   lists every transition the judged candidates show (`transitions`), the
   candidates that contradict the single boundary (`disagree`: in the OLD state
   above first_new) and, when there are any, one sentence naming the releases
   that disagree (`not_monotone`). The status stays that of the first
   transition: it is a real, confirmed boundary.

Cost with `all_transitions`: every testable candidate once (n evaluations, the
bounds included) plus at most two confirmations per transition (2t; fewer when
two transitions share a candidate), flaky re-runs aside. No fewer can be
justified without a model of how releases change: between two judged candidates
in the same state, an untested one could be the only release that differs from
both neighbours (a leak turned on in one release and off in the next), and only
evaluating it can rule that out.

`Plan(run=(), outcome=None)` means: wait for running evaluations. An outcome can
be returned while evaluations outside the interval still run; they cannot change
the answer, and the caller should cancel them.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from engine.verdicts import Verdict

Status = Literal["found", "bounds_failed", "inconclusive", "error"]


@dataclass(frozen=True)
class ReleaseState:
    """What the planner needs to know about one release of the range."""

    version: str
    testable: bool = True  # False: no installable distribution; never tested, never blamed
    verdicts: tuple[Verdict, ...] = ()  # one per completed evaluation (trials aggregated)
    running: bool = False  # an evaluation is in progress
    # Why a skipped release could not be judged, worded to follow "cannot be tested: "
    # (e.g. "its script exited 125 (...)", "uv found no resolution: ...", "the repro
    # cannot run on it (ImportError: ...)"); None: the caller does not know.
    why: str | None = None


@dataclass(frozen=True)
class Transition:
    """Two judged candidates in different states, only unjudgeable or untested ones between."""

    below: int  # the last candidate judged in the earlier state
    above: int  # the first candidate judged in the other state
    leaks_above: bool  # True: memory starts leaking at `above`; False: it stops leaking there
    confirmed: bool  # both sides evaluated twice (agreeing, or they would be flaky)


@dataclass(frozen=True)
class Outcome:
    """How the search ended."""

    status: Status
    last_old: int | None  # regression: last good; find-fix: last leaking
    first_new: int | None  # regression: first bad; find-fix: first fixed
    skipped: tuple[int, ...]  # unjudgeable indices strictly between last_old and first_new
    message: str  # one clear sentence
    # Rule 6: every transition the judged candidates show, in range order (the first is
    # (last_old, first_new)); the candidates that contradict that single boundary; and,
    # when some do, one sentence naming the releases that disagree.
    transitions: tuple[Transition, ...] = ()
    disagree: tuple[int, ...] = ()
    not_monotone: str | None = None


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


def _outcome(status: Status, message: str) -> Plan:
    return Plan(run=(), outcome=Outcome(status, None, None, (), message))


# --- rule 1: bounds --------------------------------------------------------------------


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
            why = candidates[index].why or "it was skipped (its runs gave no reason)"
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


# --- rule 3: k-section -----------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _split(unknowns: Sequence[int], running: set[int]) -> list[list[int]]:
    """The non-running `unknowns`, in segments cut where a running one sits."""
    segments: list[list[int]] = [[]]
    for index in unknowns:
        if index in running:
            segments.append([])
        else:
            segments[-1].append(index)
    return [s for s in segments if s]


def _gaps(
    candidates: Sequence[ReleaseState], running: set[int], lo: int, hi: int
) -> list[list[int]]:
    """The stretches of untested testable candidates in lo..hi, cut by evaluated and
    running ones; untestable candidates are stepped over (never tested, never a cut)."""
    segments: list[list[int]] = [[]]
    for index in range(lo, hi + 1):
        if not candidates[index].testable:
            continue
        if candidates[index].verdicts or index in running:
            segments.append([])
        else:
            segments[-1].append(index)
    return [s for s in segments if s]


def _cut(segments: list[list[int]], points: int) -> list[int]:
    """Pick up to `points` candidates from `segments`, cutting the largest parts first."""
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


# --- rule 5: the witness ---------------------------------------------------------------


def _witnesses(
    candidates: Sequence[ReleaseState], running: set[int], first_new: int, last: int
) -> list[int]:
    """The evaluated or running candidates on the NEW side that are each the witness of
    the snapshot without them (rule 5). More than one can be: once the witness is in,
    a search probe beside it can look like the witness of the snapshot without the probe."""
    found = []
    for index in range(first_new + 1, last):
        if not (candidates[index].verdicts or index in running):
            continue
        without = list(candidates)
        without[index] = ReleaseState(candidates[index].version)
        if _cut(_gaps(without, running - {index}, first_new + 1, last - 1), 1) == [index]:
            found.append(index)
    return found


def _witness(
    candidates: Sequence[ReleaseState], running: set[int], first_new: int, last: int
) -> tuple[int | None, bool]:
    """(the witness to schedule, whether one is still running) for rule 5."""
    taken = _witnesses(candidates, running, first_new, last)
    if taken:
        return None, any(i in running for i in taken)
    picks = _cut(_gaps(candidates, running, first_new + 1, last - 1), 1)
    return (picks[0] if picks else None), False


# --- rule 6: the outcome ---------------------------------------------------------------


def _transitions(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool
) -> list[Transition]:
    judged = [i for i, s in enumerate(states) if s.kind in (_Kind.OLD, _Kind.NEW)]
    found = []
    for below, above in zip(judged, judged[1:], strict=False):
        if states[below].kind is not states[above].kind:
            leaks_above = (states[above].kind is _Kind.NEW) != find_fix
            confirmed = all(len(candidates[i].verdicts) >= 2 for i in (below, above))
            found.append(Transition(below, above, leaks_above, confirmed))
    return found


def _names(versions: list[str]) -> str:
    if len(versions) == 1:
        return versions[0]
    if len(versions) == 2:
        return f"{versions[0]} and {versions[1]}"
    return f"{versions[0]} to {versions[-1]}"


def _not_monotone(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool, mapped: bool
) -> str | None:
    """One sentence naming the releases that disagree with a single boundary, or None.

    The judged candidates in runs of one state, from the first NEW run on:
    "1.0.3 and 1.0.4 leak, 1.0.6 does not, 1.0.9 leaks again".
    """
    runs: list[tuple[_Kind, list[str]]] = []
    for candidate, state in zip(candidates, states, strict=True):
        if state.kind not in (_Kind.OLD, _Kind.NEW):
            continue
        if runs and runs[-1][0] is state.kind:
            runs[-1][1].append(candidate.version)
        else:
            runs.append((state.kind, [candidate.version]))
    if len(runs) <= 2:
        return None
    clauses = []
    leaked = find_fix  # find-fix: the old run (not described) leaks
    for kind, versions in runs[1:]:
        one = len(versions) == 1
        if (kind is _Kind.NEW) != find_fix:
            verb = ("leaks" if one else "leak") + (" again" if leaked else "")
            leaked = True
        else:
            verb = ("does not" if one else "do not") + ("" if clauses else " leak")
        clauses.append(f"{_names(versions)} {verb}")
    advice = "" if mapped else "; map every transition with --all-transitions"
    return "not monotone: " + ", ".join(clauses) + advice


def _final(
    candidates: Sequence[ReleaseState],
    states: list[_State],
    last_old: int,
    first_new: int,
    find_fix: bool,
    mapped: bool,
) -> Plan:
    old_word, new_word = ("last leaking", "first fixed") if find_fix else ("last good", "first bad")
    old_v, new_v = candidates[last_old].version, candidates[first_new].version
    between = tuple(range(last_old + 1, first_new))
    confirmed = all(len(candidates[i].verdicts) >= 2 for i in (last_old, first_new))
    status: Status
    if not between:
        how = "each confirmed by a second evaluation" if confirmed else "not re-run to confirm"
        status, message = "found", f"{new_word} is {new_v} and {old_word} is {old_v}, {how}"
    else:
        versions = ", ".join(candidates[i].version for i in between)
        reasons = ", ".join(f"{candidates[i].version} ({states[i].label})" for i in between)
        status, message = (
            "inconclusive",
            f"{new_word} is one of {versions}, {new_v}: {reasons} could not be judged, "
            f"and {old_word} is {old_v}",
        )
    disagree = tuple(i for i in range(first_new + 1, len(states)) if states[i].kind is _Kind.OLD)
    outcome = Outcome(
        status,
        last_old,
        first_new,
        between,
        message,
        tuple(_transitions(candidates, states, find_fix)),
        disagree,
        _not_monotone(candidates, states, find_fix, mapped),
    )
    return Plan(run=(), outcome=outcome)


def _interval(states: list[_State], last: int) -> tuple[int, int]:
    """Rule 2: (last_old, first_new), an unknown bound standing in for its expected state."""
    first_new = min(
        (i for i, s in enumerate(states) if s.kind is _Kind.NEW or i == last), default=last
    )
    last_old = max(i for i in range(first_new) if states[i].kind is _Kind.OLD or i == 0)
    return last_old, first_new


def plan(
    candidates: Sequence[ReleaseState],
    slots: int,
    *,
    find_fix: bool = False,
    confirm: bool = True,
    all_transitions: bool = False,
    witness: bool = True,
) -> Plan:
    """Decide what to evaluate next, or how the search ended.

    `slots` is how many evaluations may run at once in total; running
    candidates occupy slots. Never returns a running candidate, nor more
    candidates than free slots. `all_transitions`: map every transition of the
    range instead of the first (rules 3 and 4), without a witness. `witness`:
    False skips rule 5.
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

    last_old, first_new = _interval(states, last)
    lo, hi = (1, last - 1) if all_transitions else (last_old + 1, first_new - 1)
    unknowns = [i for i in range(lo, hi + 1) if states[i].kind is _Kind.UNKNOWN]
    # Default: rank among the interval's unknowns (an evaluated unjudgeable candidate is
    # stepped over, not a cut); all transitions: the untested gaps of the whole range, cut
    # by everything evaluated, so each point lands where the map knows least.
    segments = _gaps(candidates, running, lo, hi) if all_transitions else _split(unknowns, running)
    run.extend(_cut(segments, free - len(run)))
    if unknowns or not bounds_known:
        # Still searching, or waiting for bounds / running candidates.
        return Plan(run=tuple(run), outcome=None)
    look = witness and not all_transitions
    return _confirm_and_witness(candidates, states, run, running, free, find_fix, confirm,
                                look, all_transitions)  # fmt: skip


def _confirm_and_witness(
    candidates: Sequence[ReleaseState],
    states: list[_State],
    run: list[int],
    running: set[int],
    free: int,
    find_fix: bool,
    confirm: bool,
    look: bool,
    all_transitions: bool,
) -> Plan:
    """Rules 4 to 6, once nothing unknown can move the answer; `look`: rule 5 applies."""
    last = len(candidates) - 1
    last_old, first_new = _interval(states, last)
    pairs = (
        [(t.below, t.above) for t in _transitions(candidates, states, find_fix)]
        if all_transitions
        else [(last_old, first_new)]
    )
    pending = sorted({i for pair in pairs for i in pair if len(candidates[i].verdicts) < 2})
    pending = pending if confirm else []
    witness, witness_running = (
        _witness(candidates, running, first_new, last) if look else (None, False)
    )
    if pending or witness is not None or witness_running:
        run.extend(i for i in pending if i not in running)
        run.extend([] if witness is None else [witness])
        return Plan(run=tuple(run[:free]), outcome=None)
    return _final(candidates, states, last_old, first_new, find_fix, all_transitions)
