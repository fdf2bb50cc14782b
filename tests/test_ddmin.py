"""engine/ddmin.py: which changes make the good environment leak, and how many mixes it takes."""

import random
from collections.abc import Callable

import pytest

from engine import ddmin
from engine.ddmin import Change, Failed, Minimal, Need, Outcome, step

Oracle = Callable[[frozenset[str]], Outcome]


def names(n: int) -> list[Change]:
    return [Change(f"p{i}", "1", "2") for i in range(n)]


def drive(changes: list[Change], oracle: Oracle, slots: int = 1):
    """Loop `step` to its answer; every configuration asked, in order."""
    known: dict[frozenset[str], Outcome] = {}
    asked: list[frozenset[str]] = []
    while True:
        answer = step(changes, known, slots)
        if not isinstance(answer, Need):
            return answer, asked
        assert 0 < len(answer.configs) <= slots
        for config in answer.configs:
            assert config not in known, "asked twice"
            asked.append(config)
            known[config] = oracle(config)


def needs(*culprits: str) -> Oracle:
    return lambda c: Outcome.LEAK if set(culprits) <= c else Outcome.CLEAN


def labels(asked: list[frozenset[str]]) -> list[str]:
    return ["+".join(sorted(c)) or "-" for c in asked]


def test_changes_and_mix() -> None:
    good = {"A": "1", "b": "1", "same": "3", "gone": "1"}
    bad = {"a": "2", "b": "1.1", "same": "3", "Added_Pkg": "0.1"}
    found = ddmin.changes(good, bad)
    assert found == [
        Change("a", "1", "2"), Change("added-pkg", None, "0.1"), Change("b", "1", "1.1"),
        Change("gone", "1", None),
    ]  # fmt: skip
    assert [c.describe() for c in found] == [
        "a 1 -> 2", "added-pkg added at 0.1", "b 1 -> 1.1", "gone 1 removed",
    ]  # fmt: skip
    assert ddmin.mix(good, bad, {"added-pkg", "gone"}) == {
        "a": "1", "added-pkg": "0.1", "b": "1", "same": "3",
    }  # fmt: skip
    with pytest.raises(ValueError, match="unknown change: same"):
        ddmin.mix(good, bad, {"same"})


def test_one_culprit_among_six_exact_mixes() -> None:
    answer, asked = drive(names(6), needs("p4"))
    assert isinstance(answer, Minimal)
    assert answer == Minimal((Change("p4", "1", "2"),), True, "leaks when p4 1 -> 2 is applied")
    assert labels(asked) == [
        "-", "p0+p1+p2+p3+p4+p5",  # the ends
        "p0+p1+p2", "p3+p4+p5",  # halves
        "p3+p4",  # the first part of the leaking half leaks: p5 is never needed
        "p3", "p4",
    ]


def test_an_interaction_is_reported_as_such() -> None:
    answer, asked = drive(names(6), needs("p1", "p4"))
    assert isinstance(answer, Minimal) and answer.certified
    assert [c.name for c in answer.culprits] == ["p1", "p4"]
    assert answer.message == "leaks only when both p1 2 and p4 2 are new"
    # 1-minimal: each one-element removal was judged clean.
    assert {frozenset({"p1"}), frozenset({"p4"})} <= set(asked)
    three = drive(names(5), needs("p0", "p2", "p3"))[0]
    assert three.message == "leaks only when p0 2, p2 2 and p3 2 are all new"
    removed = [Change("a", "1", None), Change("b", None, "3")]
    assert drive(removed, needs("a", "b"))[0].message == (
        "leaks only when both a removed and b 3 are new"
    )


def test_unresolvable_mixes_are_never_blamed() -> None:
    def oracle(c: frozenset[str]) -> Outcome:
        if "p3" in c and "p2" not in c:  # p3's new release needs p2's: uv finds no solution
            return Outcome.UNRESOLVED
        return Outcome.LEAK if "p4" in c else Outcome.CLEAN

    answer, asked = drive(names(6), oracle)
    assert answer == Minimal((Change("p4", "1", "2"),), True, "leaks when p4 1 -> 2 is applied")
    assert [labels([c])[0] for c in asked if oracle(c) is Outcome.UNRESOLVED] == ["p3+p4+p5"]


def test_an_unjudged_removal_leaves_the_set_uncertified() -> None:
    def oracle(c: frozenset[str]) -> Outcome:
        if c == frozenset({"p1"}):
            return Outcome.UNRESOLVED
        return Outcome.LEAK if {"p0", "p1"} <= c else Outcome.CLEAN

    answer, _ = drive(names(2), oracle)
    assert isinstance(answer, Minimal) and not answer.certified
    assert answer.untested == (frozenset({"p1"}),)
    assert answer.message == (
        "leaks only when both p0 2 and p1 2 are new "
        "(not certified 1-minimal: 1 smaller mixes could not be judged)"
    )


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (Outcome.LEAK, Outcome.LEAK, "the good environment leaks too: nothing to minimize"),
        (Outcome.CLEAN, Outcome.CLEAN, "the bad environment does not leak: nothing to minimize"),
        (Outcome.UNRESOLVED, Outcome.LEAK, "the good environment could not be judged: it did "
         "not build or its verdict was inconclusive"),
        (Outcome.CLEAN, Outcome.UNRESOLVED, "the bad environment could not be judged: it did "
         "not build or its verdict was inconclusive"),
    ],
)  # fmt: skip
def test_the_ends_are_checked_first(good: Outcome, bad: Outcome, message: str) -> None:
    changes = names(3)
    everything = frozenset(c.name for c in changes)
    assert step(changes, {}, 2) == Need((frozenset(), everything))
    assert step(changes, {}, 1) == Need((frozenset(),))
    assert step(changes, {frozenset(): good, everything: bad}) == Failed(message)
    assert step([], {}) == Failed("the two environments are the same: nothing changed")


def test_slots_speculate_within_the_round_and_running_mixes_wait() -> None:
    changes = names(8)
    everything = frozenset(c.name for c in changes)
    known = {frozenset(): Outcome.CLEAN, everything: Outcome.LEAK}
    first, second = frozenset({"p0", "p1", "p2", "p3"}), frozenset({"p4", "p5", "p6", "p7"})
    assert step(changes, known, 3) == Need((first, second))
    assert step(changes, known, 3, running=[first]) == Need((second,))
    assert step(changes, known, 2, running=[first, second]) == Need(())
    answer, asked = drive(changes, needs("p6"), slots=3)
    assert answer.message == "leaks when p6 1 -> 2 is applied"
    assert len(asked) == len(set(asked))


def adversary_worst(n: int) -> int:
    """The most configurations `step` asks for, over every answer to every question."""
    changes = names(n)
    everything = frozenset(c.name for c in changes)

    def longest(known: dict[frozenset[str], Outcome]) -> int:
        answer = step(changes, known)
        if not isinstance(answer, Need):
            return len(known)
        (config,) = answer.configs
        if config in (frozenset(), everything):  # the ends as they must be to go on
            outcomes = [Outcome.CLEAN if not config else Outcome.LEAK]
        else:
            outcomes = list(Outcome)
        return max(longest({**known, config: o}) for o in outcomes)

    return longest({})


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_worst_case_is_exact_for_small_n(n: int) -> None:
    assert adversary_worst(n) == ddmin.worst_case_tests(n) == ddmin.EXACT_WORST[n]


@pytest.mark.parametrize("n", [6, 9, 12])
def test_random_answers_stay_within_the_bound(n: int) -> None:
    rng = random.Random(n)
    for _ in range(200):
        culprits = set(rng.sample([f"p{i}" for i in range(n)], rng.randint(1, 3)))
        unresolved = {frozenset(rng.sample([f"p{i}" for i in range(n)], 2)) for _ in range(3)}

        def oracle(
            c: frozenset[str], culprits: set[str] = culprits, unresolved: set = unresolved
        ) -> Outcome:
            if any(pair <= c for pair in unresolved) and c != frozenset(f"p{i}" for i in range(n)):
                return Outcome.UNRESOLVED
            return Outcome.LEAK if culprits <= c else Outcome.CLEAN

        answer, asked = drive(names(n), oracle)
        assert isinstance(answer, Minimal)
        assert len(asked) <= ddmin.worst_case_tests(n) == n * n + 3 * n + 2
