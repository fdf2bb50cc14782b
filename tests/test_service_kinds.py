"""service/kinds.py: one handler per trial kind, and the judged-run filter defined once."""

from contract.wire import TrialKind
from service import kinds
from service.models import Trial


def test_every_kind_has_one_handler_and_only_runs_are_judged() -> None:
    assert set(kinds.HANDLERS) == set(TrialKind)
    assert [k for k in TrialKind if kinds.handler(k).judged] == [TrialKind.RUN]
    assert [k for k in TrialKind if kinds.handler(k).runs_script] == [
        TrialKind.RUN, TrialKind.ATTRIBUTE
    ]  # fmt: skip
    assert kinds.handler("resolve").resolves and kinds.handler("commits").lists_commits


def test_the_python_and_sql_filters_agree() -> None:
    trials = [Trial(job_id=1, candidate_id=1, kind=k, number=n) for n, k in enumerate(TrialKind)]
    assert [t.kind for t in kinds.runs(trials)] == [TrialKind.RUN]
    assert [t.kind for t in kinds.traced(trials)] == [TrialKind.ATTRIBUTE]
    assert [t.kind for t in kinds.of(TrialKind.COMMITS, trials)] == [TrialKind.COMMITS]
    sql = str(kinds.JUDGED.compile(compile_kwargs={"literal_binds": True}))
    assert sql == "trial.kind IN ('run')"
