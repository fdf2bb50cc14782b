"""The planner's exact search paths, pinned.

A tiny driver plays the runners: every candidate the planner returns is
"evaluated" with its scripted truth, all of a round at once, until the planner
returns an outcome. The sequences asserted here were worked out by hand from the
rules in engine/planner.py's docstring (rank-median of the unknowns, lower index
on ties, bounds first, confirm the boundary pair once, then one witness in the
middle of the largest untested stretch between the first bad and the bad bound).
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from engine.planner import MAX_EVALUATIONS, Outcome, Plan, ReleaseState, Transition, plan
from engine.verdicts import Verdict

CLEAN, LEAK, PLATEAU = Verdict.CLEAN, Verdict.LEAK, Verdict.PLATEAU
SKIP, ERROR, INCONCLUSIVE = Verdict.SKIP, Verdict.ERROR, Verdict.INCONCLUSIVE

# What a plain search adds where its bounds may agree (engine/planner.py rule 1).
MAP = "; to map a range whose bounds agree, use --all-transitions"

# A truth is one verdict per candidate, or a list consumed one per evaluation
# (the last one repeats) to script a flaky candidate.
Truth = Verdict | Sequence[Verdict]


def version(i: int) -> str:
    return f"1.0.{i}"


def regression(n: int, first_bad: int, **overrides: Truth) -> list[Truth]:
    """Clean before `first_bad`, leaking from it on; `overrides` as `at5=SKIP`."""
    truth: list[Truth] = [CLEAN if i < first_bad else LEAK for i in range(n)]
    for key, value in overrides.items():
        truth[int(key.removeprefix("at"))] = value
    return truth


def fixed(n: int, first_good: int) -> list[Truth]:
    return [LEAK if i < first_good else CLEAN for i in range(n)]


def evaluate(truth: Truth, evaluation: int) -> Verdict:
    if isinstance(truth, Verdict):
        return truth
    return truth[min(evaluation, len(truth) - 1)]


@dataclass
class Search:
    rounds: list[tuple[int, ...]] = field(default_factory=list)
    outcome: Outcome | None = None

    @property
    def visited(self) -> list[int]:
        return [i for r in self.rounds for i in r]


def states(done: list[list[Verdict]], untestable: frozenset[int], running=frozenset()):
    return [
        ReleaseState(
            version=version(i),
            testable=i not in untestable,
            verdicts=tuple(v),
            running=i in running,
        )
        for i, v in enumerate(done)
    ]


def simulate(
    truth: list[Truth],
    slots: int,
    *,
    untestable: Sequence[int] = (),
    find_fix: bool = False,
    confirm: bool = True,
    all_transitions: bool = False,
    witness: bool = True,
) -> Search:
    """Run a whole search, completing every round's evaluations together."""
    skipped_forever = frozenset(untestable)
    done: list[list[Verdict]] = [[] for _ in truth]
    search = Search()
    for _ in range(500):
        step = plan(
            states(done, skipped_forever),
            slots,
            find_fix=find_fix,
            confirm=confirm,
            all_transitions=all_transitions,
            witness=witness,
        )
        if step.outcome is not None:
            assert step.run == ()
            search.outcome = step.outcome
            return search
        assert step.run, "planner waits although nothing is running"
        assert len(step.run) <= slots
        assert len(set(step.run)) == len(step.run)
        assert not skipped_forever & set(step.run), "an untestable candidate was picked"
        for i in step.run:
            done[i].append(evaluate(truth[i], len(done[i])))
        search.rounds.append(step.run)
    raise AssertionError("search did not end")


def up(below: int, above: int, confirmed: bool = True) -> Transition:
    """A transition where memory starts leaking at `above`."""
    return Transition(below, above, True, confirmed)


def down(below: int, above: int, confirmed: bool = True) -> Transition:
    """A transition where memory stops leaking at `above`."""
    return Transition(below, above, False, confirmed)


# --- k = 1: exact paths -------------------------------------------------------------------


def test_first_bad_in_the_middle():
    # Bounds 0 then 9; unknowns 1..8 -> 4th = 4 (clean); 5..8 -> 2nd = 6 (leak);
    # 5 alone (clean); then confirm 5 and 6; the witness: 7, 8 untested -> 7 (leak).
    search = simulate(regression(10, 6), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7]
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation",
        (up(5, 6),),
    )


def test_first_bad_is_the_last_candidate():
    # 1..8 -> 4; 5..8 -> 6; 7, 8 -> 7; 8; confirm 8 and the bad bound 9.
    search = simulate(regression(10, 9), 1)
    assert search.visited == [0, 9, 4, 6, 7, 8, 8, 9]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        8,
        9,
    )


def test_first_bad_right_after_the_good_bound():
    # 1..8 -> 4 (leak); 1..3 -> 2 (leak); 1 (leak); confirm the good bound 0 and 1.
    # Witness: 2 and 4 were evaluated, so the untested stretches are 3 and 5..8 -> 6.
    search = simulate(regression(10, 1), 1)
    assert search.visited == [0, 9, 4, 2, 1, 0, 1, 6]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        0,
        1,
    )


def test_two_candidates_only_need_bounds_and_confirmation():
    search = simulate(regression(2, 1), 1)
    assert search.visited == [0, 1, 0, 1]
    assert search.outcome.status == "found"


def test_without_confirmation():
    search = simulate(regression(10, 6), 1, confirm=False)
    assert search.visited == [0, 9, 4, 6, 5, 7]  # the witness still runs
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first bad is 1.0.6 and last good is 1.0.5, not re-run to confirm",
        (up(5, 6, confirmed=False),),
    )


def test_plateau_counts_as_good_and_agrees_with_clean():
    truth = regression(10, 6)
    truth[5] = [PLATEAU, CLEAN]
    search = simulate(truth, 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7]
    assert search.outcome.status == "found"


# --- skips and untestable candidates -------------------------------------------------------


def test_skipped_midpoint_is_stepped_around():
    # 4 skips; unknowns 1,2,3,5,6,7,8 -> 4th = 5 (clean); 6,7,8 -> 7 (leak); 6 (leak).
    # No extra witness: 7 sits where it would go (the middle of 7, 8 without it).
    search = simulate(regression(10, 6, at4=SKIP), 1)
    assert search.visited == [0, 9, 4, 5, 7, 6, 5, 6]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        5,
        6,
    )
    assert search.outcome.skipped == ()  # 4 is not between the pair


def test_only_a_skip_separates_good_and_bad():
    # 4 (clean), 6 (leak), 5 (skip): only 5 is left between 4 and 6; confirm 4, 6;
    # witness 7.
    search = simulate(regression(10, 6, at5=SKIP), 1)
    assert search.visited == [0, 9, 4, 6, 5, 4, 6, 7]
    assert search.outcome == Outcome(
        "inconclusive",
        4,
        6,
        (5,),
        "first bad is one of 1.0.5, 1.0.6: 1.0.5 (skip) could not be judged, "
        "and last good is 1.0.4",
        (up(4, 6),),
    )


def test_several_unjudgeable_candidates_separate_the_pair():
    # 4 skip; 1,2,3,5..8 -> 5 (error); 1,2,3,6,7,8 -> 3rd = 3 (clean); 6,7,8 -> 7 (leak);
    # 6 (leak); 4 and 5 remain between 3 and 6.
    search = simulate(regression(10, 6, at4=SKIP, at5=ERROR), 1)
    assert search.visited == [0, 9, 4, 5, 3, 7, 6, 3, 6]
    outcome = search.outcome
    assert (outcome.status, outcome.last_old, outcome.first_new, outcome.skipped) == (
        "inconclusive",
        3,
        6,
        (4, 5),
    )
    assert outcome.message == (
        "first bad is one of 1.0.4, 1.0.5, 1.0.6: 1.0.4 (skip), 1.0.5 (error) could not be "
        "judged, and last good is 1.0.3"
    )


def test_inconclusive_interior_candidate_is_evaluated_again_then_stepped_around():
    # Undecided: evaluated again (its runs pooled by the scheduler) up to MAX_EVALUATIONS,
    # then stepped around like a skip.
    search = simulate(regression(10, 6, at4=INCONCLUSIVE), 1)
    assert search.visited == [0, 9, 4, 4, 4, 5, 7, 6, 5, 6]
    assert search.outcome.status == "found"


def test_an_interior_candidate_decided_on_its_second_evaluation_moves_the_answer():
    search = simulate(regression(10, 6, at5=[INCONCLUSIVE, CLEAN]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 5, 6, 7]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found", 5, 6
    )  # fmt: skip
    # Never decided: after three evaluations the pair is inconclusive around it.
    search = simulate(regression(10, 6, at5=INCONCLUSIVE), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 5, 4, 6, 7]
    assert (search.outcome.status, search.outcome.skipped) == ("inconclusive", (5,))


def test_untestable_candidates_are_never_visited():
    # Unknowns 1,2,6,7,8 -> 3rd = 6 (clean); 7, 8 -> 7 (leak); witness 8.
    search = simulate(regression(10, 7), 1, untestable=(3, 4, 5))
    assert search.visited == [0, 9, 6, 7, 6, 7, 8]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        6,
        7,
    )


def test_untestable_candidate_at_the_boundary():
    # Unknowns 1..5,7,8 -> 4th = 4 (clean); 5,7,8 -> 7 (leak); 5 (clean); witness 8.
    search = simulate(regression(10, 7), 1, untestable=(6,))
    assert search.visited == [0, 9, 4, 7, 5, 5, 7, 8]
    assert search.outcome == Outcome(
        "inconclusive",
        5,
        7,
        (6,),
        "first bad is one of 1.0.6, 1.0.7: 1.0.6 (untestable) could not be judged, "
        "and last good is 1.0.5",
        (up(5, 7),),
    )


# --- bounds ---------------------------------------------------------------------------------


def test_good_bound_leaks():
    search = simulate(regression(10, 0), 1)
    assert search.visited == [0]  # no need to test the bad bound
    assert search.outcome == Outcome(
        "bounds_failed", None, None, (), "good bound 1.0.0 leaks: it must not" + MAP
    )


def test_bad_bound_is_clean():
    search = simulate(regression(10, 10), 1)
    assert search.visited == [0, 9]
    assert search.outcome == Outcome(
        "bounds_failed",
        None,
        None,
        (),
        "bad bound 1.0.9 does not leak (clean): nothing to bisect" + MAP,
    )


def test_bad_bound_plateaus():
    truth = regression(10, 10)
    truth[9] = PLATEAU
    search = simulate(truth, 1)
    assert search.outcome.message == (
        "bad bound 1.0.9 does not leak (plateau): nothing to bisect" + MAP
    )


def test_inverted_range_suggests_find_fix():
    search = simulate(fixed(10, 5), 2)
    assert search.visited == [0, 9]
    assert search.outcome == Outcome(
        "bounds_failed",
        None,
        None,
        (),
        "good bound 1.0.0 leaks and bad bound 1.0.9 does not (clean): this looks like a fix; "
        "use find-fix",
    )


def test_untestable_bound_is_an_error():
    search = simulate(regression(10, 6), 1, untestable=(0,))
    assert search.visited == []
    assert search.outcome == Outcome(
        "error",
        None,
        None,
        (),
        "good bound 1.0.0 cannot be tested: it has no installable distribution",
    )


def test_skipped_bad_bound_is_an_error():
    search = simulate(regression(10, 6, at9=SKIP), 1)
    assert search.visited == [0, 9]
    assert search.outcome.status == "error"
    assert search.outcome.message == (
        "bad bound 1.0.9 cannot be tested: it was skipped (its runs gave no reason)"
    )


def test_erroring_good_bound_is_an_error():
    search = simulate(regression(10, 6, at0=ERROR), 1)
    assert search.visited == [0]
    assert search.outcome.status == "error"
    assert search.outcome.message.startswith("good bound 1.0.0 cannot be tested: its evaluation")


def test_inconclusive_bound():
    # Evaluated again until MAX_EVALUATIONS, each time with the earlier runs pooled.
    search = simulate(regression(10, 6, at0=INCONCLUSIVE), 1)
    assert search.visited == [0] * MAX_EVALUATIONS
    assert search.outcome == Outcome(
        "inconclusive",
        None,
        None,
        (),
        "good bound 1.0.0 is inconclusive: the classifier could not tell whether it leaks",
    )


@pytest.mark.parametrize("bound", [0, 9])
def test_a_bound_decided_on_a_later_evaluation_anchors_the_search(bound):
    # Inconclusive once, then clean (good bound) or leak (bad bound): the search goes on
    # from there as if the first evaluation had decided.
    decided = CLEAN if bound == 0 else LEAK
    search = simulate(regression(10, 6, **{f"at{bound}": [INCONCLUSIVE, decided]}), 1)
    assert search.visited[:3] == ([0, 0, 9] if bound == 0 else [0, 9, 9])
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found", 5, 6
    )


def test_a_bad_bound_that_is_clean_ends_the_search_while_the_good_one_is_undecided():
    # Two slots: the good bound inconclusive, the bad one clean: nothing to bisect,
    # whatever the good bound's next evaluation says.
    search = simulate(regression(10, 10, at0=INCONCLUSIVE), 2)
    assert search.visited == [0, 9]
    assert search.outcome.status == "bounds_failed"


def test_failed_bound_ignores_speculative_results():
    # k=3: 0, 9 and the speculative 4 run together; the bad bound is clean, and 4's
    # leak (inconsistent data) changes nothing.
    search = simulate(regression(10, 10, at4=LEAK), 3)
    assert search.rounds == [(0, 9, 4)]
    assert search.outcome.status == "bounds_failed"
    assert search.outcome.message.startswith("bad bound 1.0.9 does not leak")


def test_flaky_bound_after_confirmation():
    # first bad 1: the good bound is re-run to confirm and leaks the second time.
    search = simulate(regression(10, 1, at0=[CLEAN, LEAK]), 1)
    assert search.visited == [0, 9, 4, 2, 1, 0]
    assert search.outcome == Outcome(
        "inconclusive",
        None,
        None,
        (),
        "good bound 1.0.0 is flaky: its evaluations disagree (clean, leak)",
    )


def test_too_few_candidates():
    assert plan([ReleaseState("1.0")], 1).outcome.status == "error"
    assert plan([], 1).outcome.status == "error"
    with pytest.raises(ValueError):
        plan([ReleaseState("1"), ReleaseState("2")], -1)


# --- k-section ------------------------------------------------------------------------------


def test_two_slots():
    # Bounds together; 1..8 with 2 points: ranks 3 and 6 -> 3 (clean), 6 (leak);
    # 4 and 5 both; confirm 5 and 6 together; the confirmations fill both slots, so
    # the witness (7, 8 untested -> 7) runs after them.
    search = simulate(regression(10, 6), 2)
    assert search.rounds == [(0, 9), (3, 6), (4, 5), (5, 6), (7,)]
    assert search.outcome.first_new == 6


def test_three_slots_speculate_while_checking_bounds():
    # Bounds plus the median 4; then 5..8 with 3 points: 5, 6, 7; confirm 5, 6. 7 is
    # the witness already (the middle of 7, 8 without it): nothing more.
    search = simulate(regression(10, 6), 3)
    assert search.rounds == [(0, 9, 4), (5, 6, 7), (5, 6)]
    assert (search.outcome.last_old, search.outcome.first_new) == (5, 6)


def test_sixty_four_candidates_four_slots():
    # Round 1: bounds + 21, 42 (62 unknowns in thirds); round 2: 22..41 in fifths ->
    # 25, 29, 33, 37; round 3: 34, 35, 36 all; round 4: confirm 36 and 37, and beside
    # them the witness: 38..41 and 43..62 untested -> the middle of the 20 = 52.
    search = simulate(regression(64, 37), 4)
    assert search.rounds == [(0, 63, 21, 42), (25, 29, 33, 37), (34, 35, 36), (36, 37, 52)]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        36,
        37,
    )
    for first_bad in range(1, 64):
        search = simulate(regression(64, first_bad), 4)
        assert search.outcome.first_new == first_bad
        # bounds (+2 speculative points), two rounds to bisect, one to confirm (with
        # the witness beside the confirmations: 4 slots hold all three)
        assert len(search.rounds) <= 4


# --- find-fix -------------------------------------------------------------------------------


def test_find_fix_mirrors_regression():
    search = simulate(fixed(10, 6), 1, find_fix=True)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7]
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first fixed is 1.0.6 and last leaking is 1.0.5, each confirmed by a second evaluation",
        (down(5, 6),),
    )


def test_find_fix_bounds():
    search = simulate(regression(10, 6), 1, find_fix=True)
    assert search.visited == [0]
    assert search.outcome.message == (
        "old bound 1.0.0 does not leak (clean): find-fix needs it to leak" + MAP
    )
    search = simulate([LEAK] * 10, 1, find_fix=True)
    assert search.visited == [0, 9]
    assert search.outcome.message == "new bound 1.0.9 still leaks: nothing to bisect" + MAP
    search = simulate(regression(10, 6), 2, find_fix=True)
    assert search.outcome.message == (
        "old bound 1.0.0 does not leak (clean) and new bound 1.0.9 leaks: "
        "this looks like a regression, not a fix"
    )


def test_find_fix_with_skip():
    truth = fixed(10, 6)
    truth[5] = SKIP
    search = simulate(truth, 1, find_fix=True)
    assert search.visited == [0, 9, 4, 6, 5, 4, 6, 7]
    assert search.outcome.message == (
        "first fixed is one of 1.0.5, 1.0.6: 1.0.5 (skip) could not be judged, "
        "and last leaking is 1.0.4"
    )


# --- confirmation ---------------------------------------------------------------------------


def test_flaky_first_bad_continues_the_search():
    # 6 leaks, then is clean when confirmed: it becomes flaky. The interval is now
    # (5, 9) with 7, 8 unknown -> 7 (leak); only flaky 6 separates 5 and 7; confirm 7;
    # witness 8 (the witness waited behind the confirmations in the one slot).
    search = simulate(regression(10, 6, at6=[LEAK, CLEAN]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7, 7, 8]
    assert search.outcome == Outcome(
        "inconclusive",
        5,
        7,
        (6,),
        "first bad is one of 1.0.6, 1.0.7: 1.0.6 (flaky) could not be judged, "
        "and last good is 1.0.5",
        (up(5, 7),),
    )


def test_flaky_last_good_moves_the_pair_down():
    # 5's confirmation leaks: last good falls back to 4, which needs its own re-run;
    # then 6's; witness 7.
    search = simulate(regression(10, 6, at5=[CLEAN, LEAK]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 4, 6, 7]
    outcome = search.outcome
    assert (outcome.status, outcome.last_old, outcome.first_new, outcome.skipped) == (
        "inconclusive",
        4,
        6,
        (5,),
    )


def test_flaky_first_bad_then_clean_search_finds_the_real_boundary():
    # 6 leaked once by accident; the real first bad is 8. After 6 turns flaky the
    # search continues in (5, 9): 7 (clean), 8 (leak); confirm 7 and 8. The pair is
    # adjacent, so the answer is found although 6 was flaky.
    search = simulate(regression(10, 8, at6=[LEAK, CLEAN]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7, 8, 7, 8]
    assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
        "found",
        7,
        8,
    )


# --- only leak against bounded is a contradiction (issue #35, item 3) ------------------------


def test_an_inconclusive_confirmation_is_not_a_contradiction():
    # 6 leaks, its re-run is inconclusive: not flaky, still the first bad, re-run once
    # more; that third evaluation leaks and confirms it. Then the witness, 7.
    search = simulate(regression(10, 6, at6=[LEAK, INCONCLUSIVE, LEAK]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 6, 7]
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation",
        (up(5, 6),),
    )


def test_a_bad_bound_whose_confirmation_is_inconclusive_is_not_flaky():
    # The job: the bad bound leaked, its re-run came out inconclusive, and the job
    # ended "bad bound ... is flaky: its evaluations disagree (leak, inconclusive)". Now
    # the re-run decides nothing and the bound runs once more.
    search = simulate(regression(10, 9, at9=[LEAK, INCONCLUSIVE, LEAK]), 1)
    assert search.visited == [0, 9, 4, 6, 7, 8, 8, 9, 9]
    assert search.outcome == Outcome(
        "found",
        8,
        9,
        (),
        "first bad is 1.0.9 and last good is 1.0.8, each confirmed by a second evaluation",
        (up(8, 9),),
    )


def test_a_skipped_or_erroring_re_run_contradicts_nothing():
    for undecided in (SKIP, ERROR):
        # 5's re-run decides nothing: the confirmations go in index order, 5 again first.
        search = simulate(regression(10, 6, at5=[CLEAN, undecided, PLATEAU]), 1)
        assert search.visited == [0, 9, 4, 6, 5, 5, 5, 6, 7], undecided
        assert (search.outcome.status, search.outcome.last_old, search.outcome.first_new) == (
            "found",
            5,
            6,
        )


def test_leak_against_clean_is_flaky_whatever_came_between():
    # 6: leak, then inconclusive (re-run again), then clean: leak against clean is the one
    # contradiction, and 6 is stepped around as before: 7 is the first bad, found with 6
    # unjudgeable between.
    search = simulate(regression(10, 6, at6=[LEAK, INCONCLUSIVE, CLEAN]), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 6, 7, 7, 8]
    assert search.outcome == Outcome(
        "inconclusive",
        5,
        7,
        (6,),
        "first bad is one of 1.0.6, 1.0.7: 1.0.6 (flaky) could not be judged, "
        "and last good is 1.0.5",
        (up(5, 7),),
    )


def test_re_runs_that_decide_nothing_stop_at_the_evaluation_bound():
    # MAX_EVALUATIONS = 3: 6 leaks once, then its two re-runs are inconclusive (or error:
    # this test pinned "flaky" for an erroring re-run before issue #35). Unconfirmed, it
    # is stepped around like a flaky one: 7 becomes the first bad.
    assert MAX_EVALUATIONS == 3
    for undecided in (INCONCLUSIVE, ERROR):
        search = simulate(regression(10, 6, at6=[LEAK, undecided]), 1)
        assert search.visited == [0, 9, 4, 6, 5, 5, 6, 6, 7, 7, 8]
        assert search.visited.count(6) == MAX_EVALUATIONS
        assert search.outcome == Outcome(
            "inconclusive",
            5,
            7,
            (6,),
            f"first bad is one of 1.0.6, 1.0.7: 1.0.6 (unconfirmed: leak, {undecided.value}, "
            f"{undecided.value}) could not be judged, and last good is 1.0.5",
            (up(5, 7),),
        )


def test_an_unconfirmed_bound_ends_the_search_inconclusive():
    search = simulate(regression(10, 9, at9=[LEAK, INCONCLUSIVE]), 1)
    assert search.visited == [0, 9, 4, 6, 7, 8, 8, 9, 9]
    assert search.outcome == Outcome(
        "inconclusive",
        None,
        None,
        (),
        "bad bound 1.0.9 is unconfirmed: its evaluations were leak, inconclusive, "
        "inconclusive; its re-runs decided nothing, pooled or alone",
    )
    search = simulate(regression(10, 1, at0=[CLEAN, INCONCLUSIVE]), 1)
    assert search.visited == [0, 9, 4, 2, 1, 0, 0]
    assert search.outcome.message == (
        "good bound 1.0.0 is unconfirmed: its evaluations were clean, inconclusive, "
        "inconclusive; its re-runs decided nothing, pooled or alone"
    )


def test_a_candidate_is_never_evaluated_more_than_the_bound():
    """Random truths whose candidates each answer a random script of verdicts: however the
    re-runs come out, no candidate is evaluated more than MAX_EVALUATIONS times."""
    verdicts = [CLEAN, LEAK, PLATEAU, INCONCLUSIVE, SKIP, ERROR]
    most = []
    for seed in range(200):
        rng = random.Random(seed)
        n = rng.randint(2, 12)
        truth: list[Truth] = [[rng.choice(verdicts) for _ in range(4)] for _ in range(n)]
        search = simulate(truth, rng.choice([1, 2, 3]), all_transitions=rng.random() < 0.5)
        most.append(max(search.visited.count(i) for i in range(n)))
    assert max(most) == MAX_EVALUATIONS  # reached (18 of the 200 draws), never passed


# --- running candidates ---------------------------------------------------------------------


def snapshot(n: int, verdicts: dict[int, Sequence[Verdict]], running: Sequence[int] = ()):
    return [
        ReleaseState(version(i), verdicts=tuple(verdicts.get(i, ())), running=i in running)
        for i in range(n)
    ]


def test_running_candidates_are_cuts_and_use_slots():
    bounds = {0: [CLEAN], 9: [LEAK]}
    # 4 runs: segments 1..3 and 5..8; one free slot goes to the larger one's median.
    assert plan(snapshot(10, bounds, running=[4]), 2) == Plan((6,), None)
    # two free slots: one in each segment.
    assert plan(snapshot(10, bounds, running=[4]), 3) == Plan((2, 6), None)
    # no free slot: wait.
    assert plan(snapshot(10, bounds, running=[4]), 1) == Plan((), None)
    # more running than slots (slots shrank): wait, never negative.
    assert plan(snapshot(10, bounds, running=[4, 6]), 1) == Plan((), None)


def test_running_bounds():
    # One slot, good bound running: wait rather than test the bad bound concurrently.
    assert plan(snapshot(10, {}, running=[0]), 1) == Plan((), None)
    # Two slots: the bad bound joins.
    assert plan(snapshot(10, {}, running=[0]), 2) == Plan((9,), None)
    # Three: the bad bound and a speculative median.
    assert plan(snapshot(10, {}, running=[0]), 3) == Plan((9, 4), None)
    # The interval is resolved, but the bad bound is still running: wait for it.
    assert plan(snapshot(3, {0: [CLEAN], 1: [CLEAN]}, running=[2]), 4) == Plan((), None)


def test_waits_for_running_interior_candidates():
    bounds = {0: [CLEAN], 3: [LEAK]}
    assert plan(snapshot(4, bounds, running=[1, 2]), 4) == Plan((), None)


def test_running_confirmation_is_not_repeated():
    verdicts = {0: [CLEAN], 4: [CLEAN], 5: [CLEAN], 6: [LEAK], 9: [LEAK]}
    assert plan(snapshot(10, verdicts), 2) == Plan((5, 6), None)
    assert plan(snapshot(10, verdicts, running=[5]), 2) == Plan((6,), None)
    # Free slots beside running confirmations take the witness (7, 8 untested -> 7).
    assert plan(snapshot(10, verdicts, running=[5, 6]), 4) == Plan((7,), None)
    assert plan(snapshot(10, verdicts, running=[5, 6, 7]), 4) == Plan((), None)


def test_outcome_does_not_wait_for_candidates_outside_the_interval():
    # 7 (leak) is the witness already: the middle of 7, 8 without it.
    verdicts = {0: [CLEAN], 4: [CLEAN], 5: [CLEAN, CLEAN], 6: [LEAK, LEAK], 7: [LEAK], 9: [LEAK]}
    step = plan(snapshot(10, verdicts, running=[2]), 2)
    assert step.outcome is not None and step.outcome.status == "found"


def test_inconsistent_data_takes_the_first_leak():
    # 3 leaks but 6 is clean: the boundary is the first leak and the last good below it.
    verdicts = {0: [CLEAN], 3: [LEAK], 6: [CLEAN], 9: [LEAK]}
    assert plan(snapshot(10, verdicts), 1) == Plan((1,), None)
    verdicts.update({1: [CLEAN], 2: [CLEAN]})
    assert plan(snapshot(10, verdicts), 2) == Plan((2, 3), None)


# --- the witness and non-monotone ranges ---------------------------------------------------

NOT_MONOTONE = (
    "not monotone: 1.0.3 and 1.0.4 leak, 1.0.6 does not, 1.0.9 leaks again; "
    "map every transition with --all-transitions"
)


def twice_leaking(n: int = 10) -> list[Truth]:
    """Leaks in 1.0.3-1.0.4 and again from 1.0.7 (the end-to-end fixture's shape)."""
    return [LEAK if 3 <= i <= 4 or i >= 7 else CLEAN for i in range(n)]


def test_the_witness_says_a_range_is_not_monotone():
    # 1..8 -> 4 (leak); 1..3 -> 2 (clean); 3 (leak); confirm 2 and 3. Witness: 4 was
    # evaluated, so the untested stretch above the first bad is 5..8 -> 6: clean.
    search = simulate(twice_leaking(), 1)
    assert search.visited == [0, 9, 4, 2, 3, 2, 3, 6]
    assert search.outcome == Outcome(
        "found",
        2,
        3,
        (),
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        (up(2, 3), down(4, 6, confirmed=False), up(6, 9, confirmed=False)),
        (6,),
        NOT_MONOTONE,
    )


def test_k_section_can_see_the_contradiction_itself():
    # 2 slots: 3 (leak) and 6 (clean) in one round; 1, 2 (clean); confirm 2, 3. 6 is
    # where the witness would go (the middle of 4..8 without it): no extra run.
    search = simulate(twice_leaking(), 2)
    assert search.rounds == [(0, 9), (3, 6), (1, 2), (2, 3)]
    outcome = search.outcome
    assert (outcome.status, outcome.last_old, outcome.first_new) == ("found", 2, 3)
    assert outcome.transitions == (up(2, 3), down(3, 6, False), up(6, 9, False))
    assert outcome.disagree == (6,)
    assert outcome.not_monotone == (
        "not monotone: 1.0.3 leaks, 1.0.6 does not, 1.0.9 leaks again; "
        "map every transition with --all-transitions"
    )


def test_witness_runs_beside_the_confirmations_when_slots_are_free():
    verdicts = {0: [CLEAN], 2: [CLEAN], 3: [LEAK], 4: [LEAK], 9: [LEAK]}
    # 4 evaluated cuts 4..8: the stretch 5..8 -> its lower middle 6.
    assert plan(snapshot(10, verdicts), 3) == Plan((2, 3, 6), None)
    assert plan(snapshot(10, verdicts), 1) == Plan((2,), None)
    confirmed = {**verdicts, 2: [CLEAN, CLEAN], 3: [LEAK, LEAK]}
    assert plan(snapshot(10, confirmed), 1) == Plan((6,), None)
    # The witness running: wait for it (it is what the outcome would report).
    assert plan(snapshot(10, confirmed, running=[6]), 2) == Plan((), None)
    # Another candidate running elsewhere on that side is a cut, not the witness.
    assert plan(snapshot(10, confirmed, running=[8]), 2) == Plan((6,), None)


def test_no_witness_when_nothing_above_the_first_bad_is_untested():
    verdicts = {0: [CLEAN], 6: [CLEAN, CLEAN], 7: [LEAK, LEAK], 8: [LEAK], 9: [LEAK]}
    step = plan(snapshot(10, verdicts), 1)
    assert step.run == () and step.outcome is not None
    assert (step.outcome.status, step.outcome.not_monotone) == ("found", None)


def test_an_unjudgeable_witness_is_not_replaced():
    # One witness at most: a skipped one says nothing, and no second one runs.
    search = simulate(regression(10, 6, at7=SKIP), 1)
    assert search.visited == [0, 9, 4, 6, 5, 5, 6, 7]
    assert search.outcome.status == "found"
    assert search.outcome.transitions == (up(5, 6),)
    assert (search.outcome.disagree, search.outcome.not_monotone) == ((), None)


def test_the_witness_in_find_fix():
    # Find-fix (NEW = bounded): leaking 0..2, fixed from 3. First with 6 fixed too (the
    # witness agrees), then with 6 leaking (it contradicts): the same path either way,
    # and the sentence says it in find-fix's words.
    truth = [CLEAN if 3 <= i <= 6 else LEAK for i in range(10)]
    truth[9] = CLEAN
    search = simulate(truth, 1, find_fix=True)
    # 4 (clean = new); 1..3 -> 2 (leak); 3 (clean); confirm 2, 3; witness 5..8 -> 6.
    assert search.visited == [0, 9, 4, 2, 3, 2, 3, 6]
    assert (search.outcome.last_old, search.outcome.first_new) == (2, 3)
    assert search.outcome.not_monotone is None  # 6 is fixed too: nothing contradicts
    truth[6] = LEAK
    search = simulate(truth, 1, find_fix=True)
    assert search.visited == [0, 9, 4, 2, 3, 2, 3, 6]
    assert search.outcome.transitions == (down(2, 3), up(4, 6, False), down(6, 9, False))
    assert search.outcome.disagree == (6,)
    assert search.outcome.not_monotone == (
        "not monotone: 1.0.3 and 1.0.4 do not leak, 1.0.6 leaks again, 1.0.9 does not; "
        "map every transition with --all-transitions"
    )


def test_inconsistent_data_is_said_out_loud():
    verdicts = {0: [CLEAN], 1: [CLEAN, CLEAN], 2: [CLEAN, CLEAN], 3: [LEAK, LEAK]}
    verdicts |= {4: [LEAK], 5: [LEAK], 6: [CLEAN], 7: [LEAK], 9: [LEAK]}
    step = plan(snapshot(10, verdicts), 1)
    assert step.outcome is not None
    assert (step.outcome.status, step.outcome.last_old, step.outcome.first_new) == (
        "found",
        2,
        3,
    )
    assert step.outcome.disagree == (6,)
    assert step.outcome.not_monotone == (
        "not monotone: 1.0.3 to 1.0.5 leak, 1.0.6 does not, 1.0.7 and 1.0.9 leak again; "
        "map every transition with --all-transitions"
    )


# --- all transitions --------------------------------------------------------------------------


def test_all_transitions_maps_every_one_with_one_slot():
    # Every testable candidate once, into the largest untested gap each time: bounds;
    # 1..8 -> 4 (leak); gaps 1..3, 5..8 -> 6 (clean); 1..3 -> 2 (clean); 7, 8 -> 7
    # (leak); then the single ones left to right: 1, 3, 5, 8. Then both sides of the
    # three transitions (2|3, 4|5, 6|7) once more, in index order.
    search = simulate(twice_leaking(), 1, all_transitions=True)
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 4, 5, 6, 7]
    assert len(search.visited) == 10 + 2 * 3  # n + 2t
    assert search.outcome == Outcome(
        "found",
        2,
        3,
        (),
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        (up(2, 3), down(4, 5), up(6, 7)),
        (5, 6),
        "not monotone: 1.0.3 and 1.0.4 leak, 1.0.5 and 1.0.6 do not, 1.0.7 to 1.0.9 leak again",
    )


def test_all_transitions_with_four_slots():
    # Bounds + 3, 6 (ranks 3 and 6 of 1..8); gaps 1-2, 4-5, 7-8 take 4 points: 1, 2, 4, 7;
    # then 5, 8; then the six confirmations, four at a time.
    search = simulate(twice_leaking(), 4, all_transitions=True)
    assert search.rounds == [(0, 9, 3, 6), (1, 2, 4, 7), (5, 8), (2, 3, 4, 5), (6, 7)]
    assert search.outcome.transitions == (up(2, 3), down(4, 5), up(6, 7))


def test_all_transitions_of_a_monotone_range():
    search = simulate(regression(10, 6), 2, all_transitions=True)
    assert sorted(search.visited) == sorted([*range(10), 5, 6])
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation",
        (up(5, 6),),
    )


def test_all_transitions_flaky_confirmation_is_stepped_around():
    # 4 leaks, then is clean when confirmed: flaky. The transition 4|5 becomes 3|5 with 4
    # between, and 5's confirmation still comes; 3 was confirmed already.
    truth = twice_leaking()
    truth[4] = [LEAK, CLEAN]
    search = simulate(truth, 1, all_transitions=True)
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 4, 5, 6, 7]
    assert search.outcome.transitions == (up(2, 3), down(3, 5), up(6, 7))
    assert search.outcome.not_monotone == (
        "not monotone: 1.0.3 leaks, 1.0.5 and 1.0.6 do not, 1.0.7 to 1.0.9 leak again"
    )
    # The first transition's first bad flaky: its pair spans it, the answer is a range.
    truth = twice_leaking()
    truth[3] = [LEAK, CLEAN]
    search = simulate(truth, 1, all_transitions=True)
    # ... 2, 3 (flaky: the pair is now 2|4), 4, 5, 6, 7.
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 4, 5, 6, 7]
    outcome = search.outcome
    assert (outcome.status, outcome.last_old, outcome.first_new, outcome.skipped) == (
        "inconclusive",
        2,
        4,
        (3,),
    )
    assert outcome.transitions == (up(2, 4), down(4, 5), up(6, 7))


def test_all_transitions_steps_around_unjudgeable_candidates():
    # 5 skips, 8 is untestable: 8 is never picked, 5 once, and the 4|6 transition spans 5.
    truth = twice_leaking()
    truth[5] = SKIP
    search = simulate(truth, 1, untestable=(8,), all_transitions=True)
    assert 8 not in search.visited and search.visited.count(5) == 1
    # 1..7 (8 untestable) -> 4; gaps 1..3, 5..7 -> 2; 5..7 -> 6; then 1, 3, 5, 7.
    assert search.visited == [0, 9, 4, 2, 6, 1, 3, 5, 7, 2, 3, 4, 6, 7]
    assert search.outcome.transitions == (up(2, 3), down(4, 6), up(6, 7))
    assert search.outcome.not_monotone == (
        "not monotone: 1.0.3 and 1.0.4 leak, 1.0.6 does not, 1.0.7 and 1.0.9 leak again"
    )


def test_all_transitions_find_fix():
    truth = [CLEAN if 3 <= i <= 4 or i >= 7 else LEAK for i in range(10)]
    search = simulate(truth, 1, find_fix=True, all_transitions=True)
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 4, 5, 6, 7]
    assert search.outcome.transitions == (down(2, 3), up(4, 5), down(6, 7))
    assert search.outcome.message == (
        "first fixed is 1.0.3 and last leaking is 1.0.2, each confirmed by a second evaluation"
    )
    assert search.outcome.not_monotone == (
        "not monotone: 1.0.3 and 1.0.4 do not leak, 1.0.5 and 1.0.6 leak again, "
        "1.0.7 to 1.0.9 do not"
    )


def test_all_transitions_still_refuses_inverted_bounds():
    # A leaking good bound waits for the bad bound (the two may agree); both in the wrong
    # state is the wrong mode, refused as in a plain search.
    search = simulate(fixed(10, 5), 1, all_transitions=True)
    assert search.visited == [0, 9]
    assert search.outcome == Outcome(
        "bounds_failed",
        None,
        None,
        (),
        "good bound 1.0.0 leaks and bad bound 1.0.9 does not (clean): this looks like a fix; "
        "use find-fix",
    )


# --- all transitions of a range whose bounds agree (issue #35, item 5) ------------------------


def band(n: int, inside: Verdict, outside: Verdict, start: int, stop: int) -> list[Truth]:
    """`outside` everywhere but `start`..`stop` (inclusive), which is `inside`."""
    return [inside if start <= i <= stop else outside for i in range(n)]


def test_all_transitions_maps_a_leaking_band_between_clean_bounds():
    # Both bounds clean, 1.0.3-1.0.5 leak. The probes go where they go in any map (every
    # release once, largest untested gap first: the same order as above), then both sides
    # of the two transitions once more: n + 2t = 14 evaluations.
    search = simulate(band(10, LEAK, CLEAN, 3, 5), 1, all_transitions=True)
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 5, 6]
    assert search.outcome == Outcome(
        "found",
        2,
        3,
        (),
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        (up(2, 3), down(5, 6)),
        (6, 7, 8, 9),
        "not monotone: 1.0.3 to 1.0.5 leak, 1.0.6 to 1.0.9 do not",
    )
    # Two slots: the same releases, two at a time.
    search = simulate(band(10, LEAK, CLEAN, 3, 5), 2, all_transitions=True)
    assert search.rounds == [(0, 9), (3, 6), (1, 4), (2, 7), (5, 8), (2, 3), (5, 6)]
    assert search.outcome.transitions == (up(2, 3), down(5, 6))


def test_all_transitions_maps_a_clean_band_between_leaking_bounds():
    # Both bounds leak, 1.0.3-1.0.5 do not: the pair is the first transition that starts
    # leaking (1.0.5 | 1.0.6), and the leaking releases below it disagree with it.
    search = simulate(band(10, CLEAN, LEAK, 3, 5), 1, all_transitions=True)
    assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8, 2, 3, 5, 6]
    assert search.outcome == Outcome(
        "found",
        5,
        6,
        (),
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation",
        (down(2, 3), up(5, 6)),
        (0, 1, 2),
        "not monotone: 1.0.0 to 1.0.2 leak, 1.0.3 to 1.0.5 do not, 1.0.6 to 1.0.9 leak again",
    )


def test_all_transitions_find_fix_maps_a_leaking_band_between_fixed_bounds():
    search = simulate(band(6, LEAK, CLEAN, 2, 3), 1, find_fix=True, all_transitions=True)
    assert search.visited == [0, 5, 2, 3, 1, 4, 1, 2, 3, 4]
    assert search.outcome == Outcome(
        "found",
        3,
        4,
        (),
        "first fixed is 1.0.4 and last leaking is 1.0.3, each confirmed by a second evaluation",
        (up(1, 2), down(3, 4)),
        (0, 1),
        "not monotone: 1.0.0 and 1.0.1 do not leak, 1.0.2 and 1.0.3 leak, 1.0.4 and 1.0.5 do not",
    )


def test_all_transitions_says_plainly_when_there_is_no_transition():
    # Every testable release once, nothing to confirm: the bounds did not bracket a change.
    for truth, what in ((CLEAN, "is clean"), (LEAK, "leaks"), (PLATEAU, "plateaus")):
        search = simulate([truth] * 10, 1, all_transitions=True)
        assert search.visited == [0, 9, 4, 6, 2, 7, 1, 3, 5, 8]
        assert search.outcome == Outcome(
            "bounds_failed",
            None,
            None,
            (),
            f"no transition: every one of the 10 releases tested {what} (1.0.0 .. 1.0.9)",
        )
    mixed = [CLEAN] * 5 + [PLATEAU] * 5
    assert simulate(mixed, 3, all_transitions=True).outcome.message == (
        "no transition: every one of the 10 releases tested stays bounded (clean or plateau) "
        "(1.0.0 .. 1.0.9)"
    )


def test_no_transition_names_the_releases_it_could_not_judge():
    truth: list[Truth] = [CLEAN] * 10
    truth[4], truth[6] = SKIP, INCONCLUSIVE
    search = simulate(truth, 1, untestable=(8,), all_transitions=True)
    assert search.visited == [0, 9, 4, 2, 6, 6, 6, 1, 3, 5, 7]  # 6: three evaluations
    assert search.outcome == Outcome(
        "bounds_failed",
        None,
        None,
        (),
        "no transition: every one of the 7 releases judged is clean (1.0.0 .. 1.0.9); "
        "1.0.4 (skip), 1.0.6 (inconclusive) could not be judged, so a change confined to "
        "them would not show",
    )


def map_in_random_order(
    truth: list[Truth], slots: int, rng: random.Random
) -> tuple[Outcome, list[list[Verdict]]]:
    """An --all-transitions search whose evaluations finish one at a time in random order:
    its outcome and every candidate's evaluations."""
    done: list[list[Verdict]] = [[] for _ in truth]
    running: set[int] = set()
    for _ in range(1000):
        step = plan(states(done, frozenset(), frozenset(running)), slots, all_transitions=True)
        assert not running & set(step.run)
        if step.outcome is not None:
            return step.outcome, done
        running |= set(step.run)
        assert running, "planner waits although nothing is running"
        finished = rng.choice(sorted(running))
        running.discard(finished)
        done[finished].append(evaluate(truth[finished], len(done[finished])))
    raise AssertionError("search did not end")


def true_transitions(truth: list[Truth]) -> tuple[Transition, ...]:
    """Every transition of `truth`, confirmed."""
    return tuple(
        Transition(i, i + 1, truth[i + 1] == LEAK, True)
        for i in range(len(truth) - 1)
        if truth[i] != truth[i + 1]
    )


@pytest.mark.parametrize("seed", range(40))
def test_all_transitions_maps_ranges_whose_bounds_agree(seed):
    """Random on/off ranges with any bounds but inverted ones, evaluations finishing one at
    a time in random order: every transition found and confirmed, each release evaluated
    once and each transition's sides twice; no transition said as such."""
    rng = random.Random(2000 + seed)
    n = rng.randint(2, 30)
    ends = rng.choice([(CLEAN, CLEAN), (LEAK, LEAK), (CLEAN, LEAK)])
    truth = [ends[0]] + [rng.choice([CLEAN, LEAK]) for _ in range(n - 2)] + [ends[1]]
    slots = rng.choice([1, 2, 3, 5])
    outcome, done = map_in_random_order(truth, slots, rng)
    expected = true_transitions(truth)
    assert outcome.transitions == expected
    members = {i for t in expected for i in (t.below, t.above)}
    assert [len(d) for d in done] == [2 if i in members else 1 for i in range(n)]
    if not expected:
        assert (outcome.status, outcome.first_new) == ("bounds_failed", None)
        assert outcome.message.startswith(f"no transition: every one of the {n} releases tested")
    else:
        pair = next(t for t in expected if t.leaks_above)
        assert (outcome.status, outcome.last_old, outcome.first_new) == (
            "found",
            pair.below,
            pair.above,
        )


@pytest.mark.parametrize("seed", range(30))
def test_all_transitions_finds_every_transition(seed):
    """Random on/off ranges: every transition found and confirmed at n + (members) cost."""
    rng = random.Random(seed)
    n = rng.randint(2, 30)
    truth: list[Truth] = [CLEAN] + [rng.choice([CLEAN, LEAK]) for _ in range(n - 2)] + [LEAK]
    slots = rng.choice([1, 2, 3])
    search = simulate(truth, slots, all_transitions=True)
    expected = [
        Transition(i, i + 1, truth[i + 1] == LEAK, True)
        for i in range(n - 1)
        if truth[i] != truth[i + 1]
    ]
    assert search.outcome.transitions == tuple(expected)
    members = {i for t in expected for i in (t.below, t.above)}
    assert len(search.visited) == n + len(members) <= n + 2 * len(expected)
    assert search.outcome.first_new == expected[0].above
    assert (search.outcome.not_monotone is None) == (len(expected) == 1)


# --- why a bound cannot be tested ---------------------------------------------------------


def test_a_skipped_bound_says_why_when_told():
    why = "the repro cannot run on it (AttributeError: module 'x' has no attribute 'args')"
    releases = [ReleaseState("0.11.8", verdicts=(SKIP,), why=why), ReleaseState("0.11.9")]
    assert plan(releases, 1) == Plan(
        (),
        Outcome(
            "error",
            None,
            None,
            (),
            "good bound 0.11.8 cannot be tested: the repro cannot run on it "
            "(AttributeError: module 'x' has no attribute 'args')",
        ),
    )


# --- properties -----------------------------------------------------------------------------


def ceil_log(base: int, x: int) -> int:
    """Smallest r with base**r >= x, in integers."""
    r = 0
    while base**r < x:
        r += 1
    return r


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_every_boundary_is_found(slots):
    for n in range(2, 41):
        counts = []
        for first_bad in range(1, n):
            search = simulate(regression(n, first_bad), slots)
            outcome = search.outcome
            assert (outcome.status, outcome.last_old, outcome.first_new, outcome.skipped) == (
                "found",
                first_bad - 1,
                first_bad,
                (),
            ), (n, first_bad)
            assert search.rounds[0][:2] == ((0,) if slots == 1 else (0, n - 1))
            # nothing evaluated more than twice; only the pair twice
            twice = {i for i in search.visited if search.visited.count(i) == 2}
            assert twice == {first_bad - 1, first_bad}
            # The witness, if one ran, is the last evaluation (one slot) or shares the
            # last round: above the first bad, below the bad bound, evaluated once.
            last_round = search.rounds[-1]
            witness = [i for i in last_round if first_bad < i < n - 1]
            assert len(witness) <= 1 and all(search.visited.count(i) == 1 for i in witness)
            if slots == 1:
                counts.append(len(search.visited) - len(witness))
            else:
                # with 2 slots the confirmations fill the round: the witness gets its own
                alone = last_round == tuple(witness) and witness != []
                counts.append(len(search.rounds) - alone)
                assert not alone or slots == 2
        if slots == 1:
            # 2 bounds + binary search over n - 2 unknowns + 2 confirmations (+ the
            # witness, set aside above), and the worst case reaches it exactly.
            assert max(counts) == ceil_log(2, n - 1) + 4, n
        else:
            # a bounds round, (slots + 1)-section rounds, a confirmation round
            assert max(counts) <= ceil_log(slots + 1, n - 1) + 2, n


@pytest.mark.parametrize("seed", range(40))
def test_asynchronous_completion(seed):
    """Evaluations finish one at a time in random order; the planner stays consistent."""
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    first_bad = rng.randint(1, n - 1)
    slots = rng.choice([1, 2, 3, 5])
    truth = regression(n, first_bad)
    skips = {i for i in range(1, n - 1) if rng.random() < 0.15}
    for i in skips:
        truth[i] = SKIP
    done: list[list[Verdict]] = [[] for _ in range(n)]
    running: set[int] = set()
    for _ in range(1000):
        step = plan(states(done, frozenset(), frozenset(running)), slots)
        assert not running & set(step.run), "a running candidate was returned"
        assert len(step.run) <= max(0, slots - len(running))
        if step.outcome is not None:
            break
        running |= set(step.run)
        assert running, "planner waits although nothing is running"
        finished = rng.choice(sorted(running))
        running.discard(finished)
        done[finished].append(evaluate(truth[finished], len(done[finished])))
    else:
        raise AssertionError("search did not end")
    outcome = step.outcome
    assert outcome.last_old is not None and outcome.first_new is not None
    assert outcome.last_old < first_bad <= outcome.first_new
    assert truth[outcome.last_old] == CLEAN and truth[outcome.first_new] == LEAK
    between = tuple(range(outcome.last_old + 1, outcome.first_new))
    assert outcome.skipped == between
    assert all(truth[i] == SKIP for i in between)
    assert outcome.status == ("found" if not between else "inconclusive")
    assert len(done[outcome.last_old]) >= 2 and len(done[outcome.first_new]) >= 2


@pytest.mark.parametrize("seed", range(30))
def test_asynchronous_completion_of_all_transitions(seed):
    """Evaluations finish one at a time in random order; every transition is still mapped,
    each candidate evaluated once, the transitions' sides twice."""
    rng = random.Random(1000 + seed)
    n = rng.randint(2, 30)
    truth: list[Truth] = [CLEAN] + [rng.choice([CLEAN, LEAK]) for _ in range(n - 2)] + [LEAK]
    slots = rng.choice([1, 2, 3, 5])
    outcome, done = map_in_random_order(truth, slots, rng)
    expected = true_transitions(truth)
    assert outcome.transitions == expected
    members = {i for t in expected for i in (t.below, t.above)}
    assert [len(d) for d in done] == [2 if i in members else 1 for i in range(n)]


def test_the_caller_can_leave_the_witness_out():
    # The scheduler's commit stage: the path of a search without rule 5, even where the
    # witness would have shown a contradiction.
    search = simulate(twice_leaking(), 1, witness=False)
    assert search.visited == [0, 9, 4, 2, 3, 2, 3]
    assert search.outcome.transitions == (up(2, 3),)
    assert search.outcome.not_monotone is None
