"""What the templates show, computed from the stored rows and the typed report.

Pure reads: `service.store` for rows, the service's read models (service/views.py: the
report, a job's progress) for the answer, `contract.series.downsample` for the curves.
Templates get plain values and never touch the database.
"""

from collections import OrderedDict
from dataclasses import dataclass, field
from statistics import median
from typing import Any, NamedTuple

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from contract.envargs import freeze_diff
from contract.series import downsample
from service import kinds
from service.models import Candidate, Job, MemorySample, Trial, TrialStatus
from service.schemas import CandidateRow, JobPublic, contradiction_note
from service.text import printable

MIB = 1024 * 1024
# Points per trial curve at most (min and max per bucket: spikes and floors survive).
MAX_POINTS = 2000
# Step ticks drawn at most (every k-th step beyond that).
MAX_TICKS = 500
PAGE_SIZE = 25

LETTERS = {
    "clean": "C",
    "leak": "L",
    "plateau": "P",
    "inconclusive": "?",
    "skip": "S",
    "error": "E",
}
VERDICT_WORDS = {
    "clean": "clean",
    "leak": "leaks",
    "plateau": "plateau (bounded)",
    "inconclusive": "inconclusive",
    "skip": "skipped",
    "error": "error",
}


@dataclass
class Cell:
    """One release in the candidate strip."""

    version: str
    letter: str
    css: str
    title: str
    marks: list[str] = field(default_factory=list)
    selected: bool = False
    boundary: str | None = None


def result_text(job: Job) -> str:
    """The list's result column: last good → first bad, or the first line of the message."""
    old, new = (job.result.last_old, job.result.first_new) if job.result else (None, None)
    if job.status == "found" and old and new:
        return f"{old} → {new}"
    lines = printable(job.message or "").strip().splitlines()
    return lines[0] if lines else ""


def trial_states(trials: list[Trial]) -> dict[int, str]:
    """Per candidate id: 'running' when a run trial is leased, 'queued' when one waits."""
    out: dict[int, str] = {}
    for t in trials:
        if not kinds.judged(t):
            continue
        if t.status == TrialStatus.LEASED:
            out[t.candidate_id] = "running"
        elif t.status == TrialStatus.QUEUED and out.get(t.candidate_id) != "running":
            out[t.candidate_id] = "queued"
    return out


def _cell(c: Candidate, state: str | None, public: JobPublic, row: CandidateRow | None) -> Cell:
    marks = []
    if c.yanked:
        marks.append("yanked")
    if row is not None and row.reused:
        marks.append("reused")
    # The report's row says which jobs this viewer may see named (service/report.py).
    contradicted = contradiction_note(row) if row is not None else None
    if contradicted:
        marks.append(contradicted)
    if row is not None and row.infrastructure:
        marks.append(row.infrastructure)
    if not c.testable:
        letter, css, title = "×", "untestable", f"untestable: {c.untestable_reason or ''}"
    elif state == "running":
        letter, css, title = "▶", "running", "running now"
    elif c.verdict:
        letter, css = LETTERS.get(c.verdict, "?"), c.verdict
        title = VERDICT_WORDS.get(c.verdict, c.verdict)
    elif state == "queued":
        letter, css, title = "…", "queued", "queued"
    else:
        letter, css, title = "·", "untested", "not tested"
    old, new = public.names
    boundary = (
        new if c.version == public.first_new else old if c.version == public.last_old else None
    )
    return Cell(c.version, letter, css, printable(title), marks, boundary=boundary)


def strip(candidates: list[Candidate], trials: list[Trial], public: JobPublic) -> list[Cell]:
    states = trial_states(trials)
    rows = {row.version: row for row in public.candidates}
    return [_cell(c, states.get(c.id), public, rows.get(c.version)) for c in candidates]  # type: ignore[arg-type]


def default_selection(public: JobPublic, cells: list[Cell]) -> str | None:
    """The cell shown when none is asked: the first bad, else what runs, else the last judged."""
    if public.first_new:
        return public.first_new
    for cell in cells:
        if cell.css == "running":
            return cell.version
    judged = [c for c in cells if c.css in LETTERS]
    return judged[-1].version if judged else (cells[0].version if cells else None)


def range_chart(
    candidates: list[Candidate], trials: list[Trial], public: JobPublic
) -> dict[str, Any]:
    """An SVG-ready chart: per tested release, the median floor growth and its trials' spread."""
    growth: dict[int, list[float]] = {}
    for t in trials:
        g = (t.analysis or {}).get("growth_mib") if t.status == TrialStatus.DONE else None
        if g is not None:
            growth.setdefault(t.candidate_id, []).append(float(g))
    points = []
    for i, c in enumerate(candidates):
        values = growth.get(c.id or -1, [])
        if not values:
            continue
        points.append(
            {
                "i": i,
                "version": c.version,
                "mid": c.growth_mib if c.growth_mib is not None else median(values),
                "lo": min(values),
                "hi": max(values),
                "n": len(values),
                "verdict": c.verdict or "running",
                "first_bad": c.version == public.first_new,
            }
        )
    return _scale(points, len(candidates), public.progress.judged)


def _scale(points: list[dict[str, Any]], n: int, judged: int) -> dict[str, Any]:
    width, height, pad_l, pad_b, pad_t = 640, 200, 48, 36, 12
    top = max([p["hi"] for p in points] + [1.0])
    bottom = min([p["lo"] for p in points] + [0.0])
    span = (top - bottom) or 1.0

    def y(v: float) -> float:
        return round(pad_t + (top - v) / span * (height - pad_t - pad_b), 1)

    step = (width - pad_l - 8) / max(n, 1)
    for p in points:
        p["x"] = round(pad_l + step * (p["i"] + 0.5), 1)
        p["y"], p["y_lo"], p["y_hi"] = y(p["mid"]), y(p["lo"]), y(p["hi"])
    ticks = [
        {"v": round(bottom + span * k / 4, 1), "y": y(bottom + span * k / 4)} for k in range(5)
    ]
    return {
        "width": width,
        "height": height,
        "points": points,
        "ticks": ticks,
        "left": pad_l,
        "zero": y(0.0),
        "base": height - pad_b,
        "label_y": height - pad_b + 14,
    }


def trial_rows(trials: list[Trial], candidate: Candidate | None) -> list[Trial]:
    if candidate is None:
        return []
    return [t for t in trials if t.candidate_id == candidate.id and kinds.judged(t)]


def freeze_changes(
    candidate: Candidate | None, reference: Candidate | None
) -> list[tuple[str, str | None, str | None]]:
    """Packages whose versions differ between `reference` (the last good) and `candidate`."""
    if candidate is None or reference is None or candidate.id == reference.id:
        return []
    if not candidate.freeze or not reference.freeze:
        return []
    return freeze_diff(reference.freeze, candidate.freeze)


# --------------------------------------------------------------------------- curves


class Point(NamedTuple):
    """One stored sample, as `contract.series.downsample` reads it (attributes)."""

    t: float
    rss: int
    anon: int | None
    shared: int | None
    gpu: int | None
    step: int | None


_CURVES: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
_CURVES_MAX = 128


def _load_samples(engine: Engine, trial_id: int) -> list[Any]:
    # Core rows, not ORM objects: a long trial is 10^5 samples.
    query = (
        select(
            MemorySample.t,
            MemorySample.rss,
            MemorySample.anon,
            MemorySample.shared,
            MemorySample.gpu,
            MemorySample.step,
        )
        .where(MemorySample.trial_id == trial_id)
        .order_by(col(MemorySample.t), col(MemorySample.id))
    )
    # Core, not the ORM session: a long trial is 10^5 rows, and ORM result processing would
    # cost several times the query. (Core rows will not do as they are: `Row.t` is taken.)
    with engine.connect() as conn:
        return list(map(Point._make, conn.execute(query).tuples()))


def _mib(values: list[int | None]) -> list[float | None]:
    return [None if v is None else round(v / MIB, 3) for v in values]


def _step_times(samples: list[Any]) -> tuple[list[float], dict[int, float]]:
    """Where each marked step starts: tick positions, and step number -> time."""
    ticks, first = [], {}
    last = None
    for s in samples:
        if s.step is not None and s.step != last:
            ticks.append(round(s.t, 3))
            first.setdefault(int(s.step), s.t)
            last = s.step
    return ticks, first


def _overlay(
    series: dict[str, Any] | None, samples: list[Any], first_step: dict[int, float]
) -> dict[str, Any] | None:
    """The classifier's floors and fitted slope, in the chart's time axis."""
    if not series or not series.get("floors_mib"):
        return None
    per_step = series.get("unit") == "MiB/step"
    xs = list(series.get("floor_x") or [])

    def at(x: float) -> float | None:
        if not per_step:
            return x
        known = [s for s in first_step if s <= x]
        return first_step[max(known)] if known else None

    floors = [(at(x), f) for x, f in zip(xs, series["floors_mib"], strict=False)]
    floors = [(x, f) for x, f in floors if x is not None]
    out: dict[str, Any] = {"floors": [[round(x, 3), round(f, 3)] for x, f in floors]}
    slope = series.get("slope")
    if slope is not None and xs:
        # Theil-Sen's intercept: the median of floor - slope * x.
        icpt = median(f - slope * x for x, f in zip(xs, series["floors_mib"], strict=False))
        ends = [xs[0], xs[-1]]
        line = [(at(x), icpt + slope * x) for x in ends]
        out["slope"] = [[round(x, 3), round(v, 3)] for x, v in line if x is not None]
    if per_step and series.get("window") is not None and first_step:
        start = max(first_step) - series["window"]
        out["judged_from"] = at(start)
    elif series.get("window") is not None and samples:
        out["judged_from"] = round(samples[-1].t - series["window"], 3)
    return out


def curve(engine: Engine, trial: Trial) -> dict[str, Any]:
    """The trial's downsampled curves (MiB) with the classifier's overlay; cached when done."""
    key = (str(engine.url), trial.id or 0)
    if key in _CURVES:
        _CURVES.move_to_end(key)
        return _CURVES[key]
    samples = _load_samples(engine, trial.id or 0)
    ticks, first_step = _step_times(samples)
    kept = downsample(samples, MAX_POINTS) if len(samples) > MAX_POINTS else samples
    analysis = trial.analysis or {}
    data: dict[str, Any] = {
        "trial": trial.number,
        "samples": len(samples),
        "points": len(kept),
        "t": [round(s.t, 3) for s in kept],
        "rss": _mib([s.rss for s in kept]),
        "anon": _mib([s.anon for s in kept]) if any(s.anon is not None for s in kept) else None,
        "shared": _mib([s.shared for s in kept])
        if any(s.shared is not None for s in kept)
        else None,
        "gpu": _mib([s.gpu for s in kept]) if any(s.gpu is not None for s in kept) else None,
        "steps": ticks[:: max(1, -(-len(ticks) // MAX_TICKS))],
        "host": _overlay(analysis.get("host"), samples, first_step),
        "gpu_overlay": _overlay(analysis.get("gpu"), samples, first_step),
    }
    if trial.status == TrialStatus.DONE:
        _CURVES[key] = data
        while len(_CURVES) > _CURVES_MAX:
            _CURVES.popitem(last=False)
    return data
