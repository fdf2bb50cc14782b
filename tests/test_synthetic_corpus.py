"""The realistic corpus of engine.synthetic (issue #23): its shapes, what the classifier
calls them, and that early stopping never stops a bounded one.

Counts over fixed seeds are pinned exactly; docs/benchmarks.md (sections 1 and 8) has
the same measurements over thousands of runs.
"""

import numpy as np
import pytest

from bench.earlystop import replay_corpus
from contract.floors import judged_part
from engine import synthetic
from engine.analysis import ClassifierSettings, classify_series

MIB = 1024 * 1024
BOUNDED = [s for s, truth in synthetic.CORPUS.items() if truth == "bounded"]
LEAKS = [s for s, truth in synthetic.CORPUS.items() if truth == "leak"]


def test_every_shape_has_a_truth_a_text_and_both_forms() -> None:
    assert set(synthetic.CORPUS_TEXT) == set(synthetic.CORPUS)
    assert len(BOUNDED) == 9 and LEAKS == ["ramp_slow_leak", "ramp_fast_leak", "ramp_leak_spikes"]
    for scenario in synthetic.CORPUS:
        t, v = synthetic.trace(scenario, seed=1)
        assert t[-1] == pytest.approx(synthetic.CORPUS_SECONDS.get(scenario, 300.0), abs=0.2)
        t, v, marks = synthetic.stepped_trace(scenario, seed=1)
        assert len(marks) == synthetic.CORPUS_STEPS.get(scenario, 200)
    with pytest.raises(TypeError, match="unknown corpus parameters"):
        synthetic.corpus_trace("import_ramp", import_size=3)
    with pytest.raises(ValueError, match="unknown scenario"):
        synthetic.trace("import-ramp")


def test_the_import_ramp_is_heavy_random_by_seed_then_flat() -> None:
    """100-500 MiB over 1-10 s (drawn per seed), before the first marker; slowed 2x, the
    import and every step take twice as long."""
    sizes, ends = [], []
    for seed in range(8):
        t, v, marks = synthetic.corpus_stepped("import_ramp", seed=seed)
        mib = v / MIB
        setup = marks[0][0]
        assert 1.0 <= setup <= 10.0
        level = float(np.median(mib[t > setup]))
        start = float(np.median(mib[t < 0.3]))
        assert 100 - 15 < level - start < 500 + 15  # AR(1) noise of 3 MiB
        sizes.append(round(level - start))
        ends.append(setup)
        # After the import: flat, its floor within the noise to the end.
        assert float(np.percentile(mib[-300:], 10)) == pytest.approx(level, abs=10)
        slowed = synthetic.corpus_stepped("import_ramp", seed=seed, slow=2.0)[2]
        assert slowed[0][0] == pytest.approx(2 * setup)
        assert slowed[-1][0] == pytest.approx(2 * marks[-1][0])
    assert len(set(sizes)) == 8 and max(ends) - min(ends) > 3
    fixed = synthetic.corpus_stepped("import_ramp", seed=3, import_mib=200.0, import_s=2.0)[2]
    assert fixed[0][0] == 2.0


@pytest.mark.parametrize("scenario", list(synthetic.CORPUS))
def test_what_the_classifier_never_judges_of_a_stepped_run_is_its_import(scenario: str) -> None:
    """The judged part starts after the first marker and the warm-up steps (5 %: 10 of 200,
    15 of the slow leak's 300)."""
    t, v, marks = synthetic.stepped_trace(scenario, seed=2)
    part = judged_part(t, v / MIB, marks, ClassifierSettings())
    warm = len(marks) // 20
    assert part is not None and part.per == "step"
    assert part.x.min() == warm
    # Exactly the samples from that marker on: none of the import before the first one.
    assert len(part.v) == int(np.sum(t >= marks[warm][0]))
    assert marks[0][0] >= 1.0


# Verdicts over seeds 0..19 at the corpus's run lengths (5 minutes and 200 steps; the slow
# leak 10 minutes and 300 steps): no bounded shape is ever called a leak, every leak is.
VERDICTS = {
    "import_ramp": ({"clean": 20}, {"clean": 20}),
    "late_threads": ({"inconclusive": 1, "plateau": 19}, {"inconclusive": 4, "plateau": 16}),
    "jit_warmup": ({"clean": 20}, {"clean": 7, "inconclusive": 1, "plateau": 12}),
    "gc_settles": ({"clean": 20}, {"clean": 10, "inconclusive": 10}),
    "malloc_arenas": ({"clean": 19, "inconclusive": 1}, {"clean": 5, "plateau": 15}),
    "mmap_pages": ({"clean": 15, "inconclusive": 2, "plateau": 3}, {"plateau": 20}),
    "mmap_reclaim": ({"clean": 20}, {"clean": 7, "plateau": 11, "inconclusive": 2}),
    "late_release": ({"clean": 20}, {"clean": 17, "plateau": 3}),
    "model_load": ({"clean": 20}, {"clean": 13, "plateau": 7}),
    "ramp_slow_leak": ({"leak": 20}, {"leak": 20}),
    "ramp_fast_leak": ({"leak": 20}, {"leak": 20}),
    "ramp_leak_spikes": ({"leak": 20}, {"leak": 20}),
}


def test_the_classifier_on_the_corpus() -> None:
    got = {}
    for scenario in synthetic.CORPUS:
        timed: dict[str, int] = {}
        stepped: dict[str, int] = {}
        for seed in range(20):
            t, v = synthetic.trace(scenario, seed=seed)
            verdict = classify_series(t, v).verdict.value
            timed[verdict] = timed.get(verdict, 0) + 1
            t, v, marks = synthetic.stepped_trace(scenario, seed=seed)
            verdict = classify_series(t, v, marks).verdict.value
            stepped[verdict] = stepped.get(verdict, 0) + 1
        got[scenario] = (timed, stepped)
    assert got == VERDICTS


@pytest.mark.parametrize("slow", [1.0, 2.0])
def test_early_stopping_never_stops_a_bounded_shape(slow: float) -> None:
    """Seeds 0..4 of every bounded shape with markers, at the horizon's pace and slowed 2x:
    none stopped. At its pace a run tests 20 or 21 leak looks of its budget of 22; slowed,
    all 22. Without markers no leak look is ever tested."""
    looks = set()
    for scenario in BOUNDED:
        for seed in range(5):
            r = replay_corpus(scenario, "stepped", seed, slow)
            assert not r["stopped"], (scenario, seed, r["reason"])
            assert r["budget"] == 22
            looks.add(r["looks"])
            r = replay_corpus(scenario, "time", seed, slow)
            assert (r["stopped"], r["looks"]) == (False, 0), (scenario, seed)
    assert looks == ({20, 21} if slow == 1.0 else {22})


def test_early_stopping_stops_leaks_behind_heavy_imports() -> None:
    """Seeds 0..9 with markers: every fast leak and every leak under spikes is stopped, idle
    and slowed 2x, and 10 and 8 of the slow ones; none before half the horizon's steps."""
    stops = {}
    for scenario in LEAKS:
        for slow in (1.0, 2.0):
            runs = [replay_corpus(scenario, "stepped", seed, slow) for seed in range(10)]
            stops[(scenario, slow)] = sum(r["stopped"] for r in runs)
            for r in runs:
                if r["stopped"]:
                    assert r["reason"].startswith("floor grew at least")
                    assert r["at"] / r["duration"] > 0.5
    assert stops == {
        ("ramp_slow_leak", 1.0): 10, ("ramp_slow_leak", 2.0): 8,
        ("ramp_fast_leak", 1.0): 10, ("ramp_fast_leak", 2.0): 10,
        ("ramp_leak_spikes", 1.0): 10, ("ramp_leak_spikes", 2.0): 10,
    }  # fmt: skip
