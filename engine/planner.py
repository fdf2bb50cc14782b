"""Which candidates to evaluate next, and when the bisection is over.

Pure: the local `bisect-cli run` loop and the service's scheduler hand the same
snapshot of candidates to `plan` and get the same answer, so tests can pin the
exact order in which a search visits releases.

Vocabulary. Candidates are ordered oldest to newest. Index 0 is expected to be
in the OLD state and the last index in the NEW state:

- regression (default): OLD = memory stays bounded (clean or plateau), NEW = leak;
- find-fix: OLD = leak, NEW = bounded.

The search looks for the boundary pair (last OLD, first NEW). Everything else a
candidate can be (untestable, skip, error, inconclusive, flaky, unconfirmed) is
*unjudgeable*: never blamed and, as with `git bisect skip`, stepped around. A
*transition* is two judged candidates in different states with only unjudgeable or
untested ones between them; a range is *monotone* when it has one.

A candidate's state, from its evaluations (one verdict each, its runs pooled):

- A *decisive* evaluation is leak or bounded (clean and plateau agree). Only decisive
  evaluations on opposite sides contradict each other: leak against bounded is *flaky*.
  An inconclusive evaluation contradicts nothing (its runs could not tell), and neither
  does a skip or an error re-run: a crash, an infrastructure failure or the script's
  exit 125 on a re-run carries no memory evidence, so it cannot outvote the runs that
  did (the scheduler's infrastructure retries and the bound messages say why it failed).
- Some decisive evaluations, all on one side: judged in that state (OLD or NEW),
  *confirmed* once two of them agree. The scheduler judges an evaluation that ends
  inconclusive together with the candidate's earlier evaluations' runs
  (engine/pooled.py `classify_evaluations`), and records that pooled verdict when it
  agrees with them: the pooled evidence of all the candidate's runs confirms too.
- One decisive evaluation after `MAX_EVALUATIONS` evaluations: *unconfirmed*, and
  unjudgeable. Its re-runs (rule 4) decided nothing, pooled or alone, so it cannot be
  blamed either way; the bound keeps a candidate that stays inconclusive from being
  re-run for ever.
- Every evaluation inconclusive, fewer than `MAX_EVALUATIONS` of them: *undecided*,
  and unknown for every rule below, so it is evaluated again wherever an untested
  candidate would be (a bound always; inside the interval, where it can move the
  answer), and the scheduler judges the new evaluation with the runs of the earlier
  ones. Its runs could not tell, so it cannot be stepped around yet: the unpaced runs
  of a repro without markers under a CPU hog were inconclusive three at a time, a clean
  bound among them, and clean when six were pooled.
- No decisive evaluation otherwise: unjudgeable, labelled as `engine.analysis.aggregate`
  sums its evaluations up (inconclusive before skip before error).

Rules, in the order `plan` applies them:

1. Bounds. A bound judged in the wrong state ends the search (`bounds_failed`;
   the message points at `all_transitions` when the bounds may agree); an
   untestable, skipped or erroring bound ends it with `error` (a skip says
   which reason it was, given by the caller: `ReleaseState.why`, e.g. the script
   exited 125, uv found no resolution, the repro cannot run on it); a flaky or
   unconfirmed bound with `inconclusive`, and so does an inconclusive one once it is
   no longer undecided (after `MAX_EVALUATIONS` evaluations; until then it is unknown
   and evaluated again). Results
   of interior candidates evaluated speculatively are ignored then. With
   `all_transitions`, bounds that agree (both OLD, or both NEW: a leak that
   starts and stops inside the range, or a clean band inside a leaking one) are
   no failure: the range is mapped all the same (rules 3 and 6). Only both bounds
   in the wrong state (a fix searched as a regression, or the reverse) still fail,
   and a bound in the wrong state waits for the other bound's state before
   anything ends. Unknown bounds are scheduled before anything else, the good/old
   bound first, so one free slot tests 0, then the last index, then bisects; two
   slots test both bounds at once.
2. Interval. first_new = the lowest index in the NEW state; last_old = the
   highest index below it in the OLD state. An unknown bound counts as if it
   were in its expected state (it is either that or the search stops), which is
   what lets free slots speculate inside the range while bounds are running.
   Inconsistent data (an OLD candidate above a NEW one) is thus resolved
   deterministically towards the first NEW candidate, and said out loud (rule 6).
   With `all_transitions` the interval steers nothing (rule 3 probes the whole
   range) and the pair is read from the map (rule 6).
3. k-section. The candidates that can still move the answer are the unknown
   testable ones inside the open interval (last_old, first_new); with
   `all_transitions`, every unknown testable candidate of the range, whatever
   the bounds' states. Slots left
   after the bounds cut that list into nearly equal parts, by rank among those
   unknowns (not by raw index), so unjudgeable candidates are stepped around by
   construction and untestable ones are never picked. Candidates already running
   count as cuts already made (with `all_transitions` evaluated ones too: the
   points go to the largest untested gaps, so a partial map is spread evenly):
   new points go to the largest remaining gaps. Ties prefer the lower index.
4. Confirm. Once nothing unknown is left there, both sides of the boundary pair
   (with `all_transitions`: of every transition) must be confirmed, by two
   decisive evaluations (a bound's first evaluation counts), so each is re-run
   while it has fewer, up to `MAX_EVALUATIONS` evaluations in all (two re-runs at
   most). A re-run on the opposite side makes the candidate flaky; a re-run that
   decides nothing (inconclusive, pooled with its earlier runs too; skip; error)
   leaves it judged and unconfirmed, and it runs again until the bound makes it
   unconfirmed for good. Either way a candidate that turns unjudgeable is
   stepped around and the search goes on from the new interval (the transitions
   are read again without it).
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
   `found` when none, `inconclusive` listing them when some. With
   `all_transitions` the pair is the map's first transition into the NEW state
   (regression: the first that starts leaking; with bounds in their expected
   states that is rule 2's pair). The outcome also lists every transition the
   judged candidates show (`transitions`), the candidates that contradict the
   single boundary (`disagree`: in the OLD state above first_new, or in the NEW
   state below last_old) and, when there are any, one sentence naming the
   releases that disagree (`not_monotone`). The status stays that of the pair:
   it is a real, confirmed boundary. A map that shows no transition ends
   `bounds_failed` and says so plainly: "no transition: every one of the 10
   releases tested is clean (1.0.0 .. 1.0.9)", naming the ones that could not be
   judged (a leak confined to one of them would not show). The bounds did not
   bracket a change, as a plain search's failed bound says, only now every
   testable release was looked at.

Cost with `all_transitions`: every testable candidate once (n evaluations, the
bounds included), whatever the bounds' states, plus one re-run of each side of each
transition (2t when every re-run decides; fewer when two transitions share a
candidate), one more for a side whose re-run decided nothing, and up to two more for
a candidate none of whose evaluations decided (undecided, evaluated again). Hard bound:
no candidate is evaluated more than `MAX_EVALUATIONS` times (rule 4; flaky and
unconfirmed ones are never re-run), so at most 3n evaluations, each of the job's
`repeats` runs extended to at most `max_runs` while inconclusive: 3n x max_runs
trials. No fewer probes can be justified without a model of how releases change:
between two judged candidates in the same state (both bounds clean, say), an
untested one could be the only release that differs from both neighbours (a leak
turned on in one release and off in the next), and only evaluating it can rule
that out; so a range whose bounds agree is probed like any other, every testable
release once, and "no transition" means none among all of them.

`Plan(run=(), outcome=None)` means: wait for running evaluations. An outcome can
be returned while evaluations outside the interval still run; they cannot change
the answer, and the caller should cancel them.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from engine.analysis import aggregate
from engine.verdicts import NO_TRANSITION, Verdict

Status = Literal["found", "bounds_failed", "inconclusive", "error"]

# Rule 4's bound: a candidate's first evaluation and at most two re-runs. Two, not one:
# a re-run that decides nothing is often the one noisy moment (a CPU hog, a spike longer
# than a block), and the third evaluation is judged with all the runs before it; a
# candidate still undecided after that is borderline on this machine, and more runs of
# it would only hold the search.
MAX_EVALUATIONS = 3
# Said where bounds that agree end a plain search: mapping is what such a range needs.
MAP_HINT = "to map a range whose bounds agree, use --all-transitions"


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


def _decisive(candidate: ReleaseState) -> int:
    """How many of the candidate's evaluations said leak or bounded."""
    return sum(v.decisive for v in candidate.verdicts)


def _state(candidate: ReleaseState, find_fix: bool) -> _State:
    """The candidate's state from its evaluations (the module docstring's list)."""
    if not candidate.testable:
        return _State(_Kind.UNJUDGEABLE, "untestable")
    if not candidate.verdicts:
        return _State(_Kind.UNKNOWN, "unknown")
    if _undecided(candidate):
        return _State(_Kind.UNKNOWN, "inconclusive")
    sides = {_verdict_class(v) for v in candidate.verdicts if v.decisive}
    label = ", ".join(dict.fromkeys(v.value for v in candidate.verdicts))
    if len(sides) > 1:
        # Leak against bounded: the candidate did not reproduce its own verdict, so it
        # cannot be blamed either way. An undecided evaluation beside them changes nothing.
        return _State(_Kind.UNJUDGEABLE, "flaky")
    if not sides:
        return _State(_Kind.UNJUDGEABLE, aggregate(candidate.verdicts).value)
    if _decisive(candidate) < 2 and len(candidate.verdicts) >= MAX_EVALUATIONS:
        every = ", ".join(v.value for v in candidate.verdicts)
        return _State(_Kind.UNJUDGEABLE, f"unconfirmed: {every}")
    if sides == {"leak"}:
        return _State(_Kind.NEW if not find_fix else _Kind.OLD, label)
    return _State(_Kind.OLD if not find_fix else _Kind.NEW, label)


def _undecided(candidate: ReleaseState) -> bool:
    """Evaluated, every evaluation inconclusive, and fewer than `MAX_EVALUATIONS` of them:
    it counts as unknown (the module docstring's list) and is evaluated again."""
    return (
        bool(candidate.verdicts)
        and _decisive(candidate) == 0
        and aggregate(candidate.verdicts) is Verdict.INCONCLUSIVE
        and len(candidate.verdicts) < MAX_EVALUATIONS
    )


def _outcome(status: Status, message: str) -> Plan:
    return Plan(run=(), outcome=Outcome(status, None, None, (), message))


# --- rule 1: bounds --------------------------------------------------------------------


def _bound_problem(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool, mapped: bool
) -> Plan | None:
    """The outcome when a bound cannot anchor the search, else None. `mapped`
    (all_transitions): bounds that agree are mapped, not refused (rule 1)."""
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
    if mapped:
        # One bound in the wrong state: the bounds agree, or the other is not known yet
        # (inverted or not, it is scheduled first). Either way nothing ends here.
        return _unjudgeable_bound(candidates, states, find_fix)

    # A bound judged in the wrong state is a definite answer: it outranks a bound
    # that could not be judged at all.
    if good_wrong:
        if find_fix:
            msg = f"old bound {good} does not leak ({states[0].label}): find-fix needs it to leak"
        else:
            msg = f"good bound {good} leaks: it must not"
        return _outcome("bounds_failed", f"{msg}; {MAP_HINT}")
    if bad_wrong:
        if find_fix:
            msg = f"new bound {bad} still leaks: nothing to bisect"
        else:
            msg = f"bad bound {bad} does not leak ({states[last].label}): nothing to bisect"
        return _outcome("bounds_failed", f"{msg}; {MAP_HINT}")

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
        elif state.label.startswith("unconfirmed"):
            verdicts = ", ".join(v.value for v in candidates[index].verdicts)
            return _outcome(
                "inconclusive",
                f"{name} {version} is unconfirmed: its evaluations were {verdicts}; "
                "its re-runs decided nothing, pooled or alone",
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
    """The stretches of untested (or undecided) testable candidates in lo..hi, cut by
    evaluated and running ones; untestable candidates are stepped over (never a cut)."""
    segments: list[list[int]] = [[]]
    for index in range(lo, hi + 1):
        if not candidates[index].testable:
            continue
        if (candidates[index].verdicts and not _undecided(candidates[index])) or index in running:
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
            confirmed = all(_decisive(candidates[i]) >= 2 for i in (below, above))
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
    "1.0.3 and 1.0.4 leak, 1.0.6 does not, 1.0.9 leaks again" (every run when the
    first is NEW: "1.0.0 to 1.0.2 leak, 1.0.3 to 1.0.5 do not, 1.0.6 to 1.0.9 leak
    again").
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
    # A first run in the OLD state goes without saying; one in the NEW state (a mapped
    # range whose bounds agree) is said too.
    start = 1 if runs[0][0] is _Kind.OLD else 0
    clauses = []
    leaked = find_fix and start == 1  # find-fix: the old run, not described, leaks
    for kind, versions in runs[start:]:
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
    confirmed = all(_decisive(candidates[i]) >= 2 for i in (last_old, first_new))
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
    # Judged on the wrong side of the pair: OLD above it, or (a mapped range whose bounds
    # agree) NEW below it.
    disagree = tuple(
        i
        for i, state in enumerate(states)
        if (i > first_new and state.kind is _Kind.OLD) or (i < last_old and state.kind is _Kind.NEW)
    )
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
    if (problem := _bound_problem(candidates, states, find_fix, all_transitions)) is not None:
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

    if all_transitions:  # rule 3: the whole range, whatever the bounds' states
        lo, hi = 1, last - 1
    else:
        last_old, first_new = _interval(states, last)
        lo, hi = last_old + 1, first_new - 1
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
    transitions = _transitions(candidates, states, find_fix)
    if all_transitions:
        pairs = [(t.below, t.above) for t in transitions]
        # Rule 6: the map's first transition into the NEW state is the pair.
        first = next((t for t in transitions if states[t.above].kind is _Kind.NEW), None)
        pair = None if first is None else (first.below, first.above)
    else:
        pair = _interval(states, last)
        pairs = [pair]
    pending = sorted({i for p in pairs for i in p if _decisive(candidates[i]) < 2})
    pending = pending if confirm else []
    witness, witness_running = (
        _witness(candidates, running, pair[1], last) if look and pair else (None, False)
    )
    if pending or witness is not None or witness_running:
        run.extend(i for i in pending if i not in running)
        run.extend([] if witness is None else [witness])
        return Plan(run=tuple(run[:free]), outcome=None)
    if pair is None:
        return _no_transition(candidates, states, find_fix)
    return _final(candidates, states, *pair, find_fix, all_transitions)


def _no_transition(
    candidates: Sequence[ReleaseState], states: list[_State], find_fix: bool
) -> Plan:
    """Rule 6 for a map with no transition: every judged candidate is in one state."""
    judged = [i for i, s in enumerate(states) if s.kind in (_Kind.OLD, _Kind.NEW)]
    undecided = [i for i, c in enumerate(candidates) if c.verdicts and i not in judged]
    seen = {v for i in judged for v in candidates[i].verdicts if v.decisive}
    if (states[judged[0]].kind is _Kind.NEW) != find_fix:
        what = "leaks"
    else:
        what = {
            frozenset({Verdict.CLEAN}): "is clean",
            frozenset({Verdict.PLATEAU}): "plateaus",
        }.get(frozenset(seen), "stays bounded (clean or plateau)")
    word = "tested" if not undecided else "judged"
    first, last = candidates[0].version, candidates[-1].version
    message = f"{NO_TRANSITION}: every one of the {len(judged)} releases {word} {what} "
    message += f"({first} .. {last})"
    if undecided:
        reasons = ", ".join(f"{candidates[i].version} ({states[i].label})" for i in undecided)
        them = "it" if len(undecided) == 1 else "them"
        message += f"; {reasons} could not be judged, so a change confined to {them} would not show"
    return _outcome("bounds_failed", message)
