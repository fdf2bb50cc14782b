"""The live progress display and the final report, drawn with Rich on the terminal.

A running trial has a status line (`status_line`): its candidate, the time since it started,
the steps its markers span, its memory now and its floor (the first complete step's -> the
latest's: contract/live.py, the one definition a runner's heartbeat uses too), and what the
early-stop rule can do now (contract/earlystop.py `live_state`). `run` draws it from its own
samples (`TrialWatch`); `submit --wait` from the server's `progress.running` (`JobProgress`),
which a runner's heartbeats fill. On a terminal it is redrawn in place (`LiveDisplay`,
`JobProgress`); otherwise a plain line every PLAIN_EVERY_S at most (`LineProgress`,
`JobProgress`). `run`'s samples come from the executor's thread; with `run --jobs N` they
carry no trial, so the line then has no memory. Nothing here writes to stdout (`--json` owns
it).

The client's too (`submit`, `status`, `report`): it reads the API's models only, never the
tables (`LiveDisplay` and `LineProgress`, `run`'s, are handed table rows but name their
types for the type checker alone, and import the early-stop rules, numpy's, when a trial
starts), so it needs no more than the default install.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from contract.live import LIVE_FIELDS, LiveFloors
from contract.wire import EarlyStop, Sample, TrialSpec
from engine import findings
from engine.baseenv import FORCED_NOTE
from engine.verdicts import NO_TRANSITION, Verdict
from service.cli.errors import outcome_status
from service.schemas import CandidateRow, Report, contradiction_note, transition_line
from service.text import printable

if TYPE_CHECKING:
    from service.models import Candidate, Trial

STYLE = {
    "leak": ("L", "bold white on red"),
    "clean": ("C", "bold black on green"),
    "plateau": ("P", "bold black on cyan"),
    "inconclusive": ("?", "bold black on yellow"),
    "skip": ("S", "bold white on magenta"),
    "error": ("E", "bold white on magenta"),
}
SPARK = "▁▂▃▄▅▆▇█"
PLAIN_EVERY_S = 5.0  # at most one plain status line this often, however fast samples come
MIB = 2**20


def outside(text: str | None) -> str:
    """Text that did not come from leakbisect (script output, uv, an index), made safe for
    the terminal and for Rich markup."""
    return escape(printable(text or ""))


def cell(verdict: str | None, testable: bool, running: bool) -> Text:
    if running:
        return Text(" ▶ ", style="bold black on white")
    if not testable:
        return Text(" × ", style="dim")
    if verdict is None:
        return Text(" · ", style="dim")
    symbol, style = STYLE[verdict]
    return Text(f" {symbol} ", style=style)


def sparkline(values: list[float], width: int = 48) -> str:
    if not values:
        return ""
    step = max(1, len(values) // width)
    points = [min(values[i : i + step]) for i in range(0, len(values), step)][:width]
    low, high = min(points), max(points)
    span = (high - low) or 1.0
    return "".join(SPARK[min(7, int((v - low) / span * 7.999))] for v in points)


def duration(seconds: float) -> str:
    """12s, 5m07s, 2h03m."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def status_line(
    version: str,
    elapsed_s: float,
    early_stop: str | None,
    *,
    rss: int | None = None,
    steps: int | None = None,
    floor_first: int | None = None,
    floor: int | None = None,
) -> str:
    """A running trial's status line, for `run` (`TrialWatch`) and `submit --wait`
    (`JobProgress`) alike: 1.0.6  elapsed 12s  37 steps  52 MiB, floor 48→50  early stop:
    cap only. Memory (bytes) and steps only once a sample (a heartbeat) said them; no
    early-stop words from a server that sends none."""
    parts = [version, f"elapsed {duration(elapsed_s)}"]
    if rss is not None:
        if steps is not None:  # a runner from before heartbeats said steps sends none
            parts.append(f"{steps} steps")
        memory = f"{rss / MIB:.0f} MiB"
        if floor is not None and floor_first is not None:
            memory += f", floor {floor_first / MIB:.0f}→{floor / MIB:.0f}"
        parts.append(memory)
    if early_stop is not None:
        parts.append(f"early stop: {early_stop}")
    return "  ".join(parts)


@dataclass
class TrialWatch:
    """One running trial of `run` as its status line shows it: its samples folded as a
    runner's heartbeat folds them (contract/live.py)."""

    label: str  # the candidate's version
    started: float  # time.monotonic() when it started
    early_stop: EarlyStop | None
    floors: LiveFloors = field(default_factory=LiveFloors)

    @classmethod
    def of(cls, candidate: "Candidate", trial: "Trial", spec: TrialSpec) -> "TrialWatch":
        return cls(candidate.version, time.monotonic(), spec.early_stop)

    def add(self, sample: Sample) -> None:
        self.floors.add(sample)

    def line(self, now: float) -> str:
        # numpy, imported by the rules module: `run` has it; the client gets the words from
        # the server (service/views.py).
        from contract.earlystop import live_state

        state = self.floors.state
        words = live_state(self.early_stop, state.steps)
        return status_line(self.label, now - self.started, words, **state.said())


class LiveDisplay:
    """Candidates as a row of cells that fill in as verdicts arrive, and a status line per
    running trial, redrawn four times a second."""

    def __init__(self, console: Console, candidates: list["Candidate"], package: str) -> None:
        self.console = console
        self.package = package
        self.cells = {c.id: [c.version, c.verdict, c.testable] for c in candidates}
        self.order = [c.id for c in candidates]
        self.started = time.monotonic()
        self.trials = 0
        # trial id -> (its watch, its candidate): several with `run --jobs N`.
        self.running: dict[int | None, tuple[TrialWatch, int | None]] = {}
        self.lock = threading.Lock()  # samples arrive on the executor's thread
        self.live = Live(
            console=console, refresh_per_second=4, transient=True, get_renderable=self._render
        )

    def __enter__(self) -> "LiveDisplay":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)  # type: ignore[arg-type]

    def _render(self) -> Group:
        now = time.monotonic()
        with self.lock:
            running = list(self.running.values())
            lines = [
                Text(f"▶ {w.line(now)}", no_wrap=True, overflow="ellipsis") for w, _ in running
            ]
        row = Text()
        for cid in self.order:
            _, verdict, testable = self.cells[cid]
            busy = any(cid == candidate for _, candidate in running)
            row.append_text(cell(verdict, testable, busy))
        first, last = self.cells[self.order[0]][0], self.cells[self.order[-1]][0]
        status = (
            f"{self.package} {first} … {last}   trials: {self.trials}   "
            f"elapsed: {duration(now - self.started)}"
        )
        return Group(Text(status), row, *lines)

    def refresh(self) -> None:
        self.live.refresh()

    def trial_started(self, candidate: "Candidate", trial: "Trial", spec: TrialSpec) -> None:
        with self.lock:
            self.running[trial.id] = (TrialWatch.of(candidate, trial, spec), candidate.id)
        self.refresh()

    def sample(self, sample: Sample) -> None:
        with self.lock:  # samples carry no trial: only `run` with one trial at a time sends them
            if len(self.running) == 1:
                next(iter(self.running.values()))[0].add(sample)

    def trial_finished(self, candidate: "Candidate", trial: "Trial", verdict: Verdict) -> None:
        self.trials += 1
        self.cells[candidate.id][1] = candidate.verdict or verdict.value
        with self.lock:
            self.running.pop(trial.id, None)
        reason = outside((trial.analysis or {}).get("reason", ""))
        self.console.print(
            f"  {candidate.version:<14} trial {trial.number}: {verdict.value:<12} {reason}"
        )
        self.refresh()

    def message(self, text: str) -> None:
        self.console.print(outside(text))


class LineProgress:
    """Plain lines for a stderr that is not a terminal (CI logs): the running trial's status
    line at most every PLAIN_EVERY_S, as its samples come."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.watch: TrialWatch | None = None
        self.printed = 0.0

    def trial_started(self, candidate: "Candidate", trial: "Trial", spec: TrialSpec) -> None:
        self.console.print(f"running {candidate.version} (trial {trial.number})")
        self.watch = TrialWatch.of(candidate, trial, spec)
        self.printed = self.watch.started

    def sample(self, sample: Sample) -> None:
        watch = self.watch  # the executor's thread: the trial may end meanwhile
        if watch is None:  # a traced run: no status line of its own
            return
        watch.add(sample)
        now = time.monotonic()
        if now - self.printed >= PLAIN_EVERY_S:
            self.printed = now
            self.console.print(f"  {watch.line(now)}", soft_wrap=True)

    def trial_finished(self, candidate: "Candidate", trial: "Trial", verdict: Verdict) -> None:
        self.watch = None
        reason = outside((trial.analysis or {}).get("reason", ""))
        self.console.print(f"  {candidate.version}: {verdict.value} {reason}")

    def message(self, text: str) -> None:
        self.console.print(outside(text))


def print_report(report: Report, curves: dict[int, list[float]], json_: bool) -> NoReturn:
    """The final report (JSON or Rich) and the exit status of its job status (`run`,
    `submit --wait`)."""
    if json_:
        typer.echo(json.dumps(report.wire()))
    else:
        render_report(Console(), report, curves)
    raise typer.Exit(outcome_status(report.status))


def render_report(console: Console, report: Report, curves: dict[int, list[float]]) -> None:
    """The text report: headline, candidates, evidence, dependency diff, environment, machine,
    reproduce."""
    _headline(console, report)
    console.print(_candidate_table(report))
    _evidence(console, report, curves)
    _dependency_diff(console, report)
    _findings(console, report)
    if report.environment:
        console.print(f"environment: {report.environment}", soft_wrap=True)
    if report.machine:
        console.print(f"machine: {_machine_text(report.machine)}")
    if report.reproduce:
        console.print(f"reproduce: {report.reproduce}", soft_wrap=True)


def _headline(console: Console, report: Report) -> None:
    old_key, new_key = (name.replace("_", " ") for name in report.names)
    if report.status == "found":
        console.print(
            f"[bold]{report.package}[/]: {new_key} is [bold red]{report.first_new}[/], "
            f"{old_key} is [bold green]{report.last_old}[/]"
        )
    else:
        console.print(f"[bold]{report.package}[/]: {report.status.replace('_', ' ')}")
    if report.message:
        console.print(outside(report.message))  # a non-monotone range: its second line
    if len(report.transitions) > 1:
        console.print("transitions:")
        for row in report.transitions:
            console.print(f"  {outside(transition_line(row))}", soft_wrap=True)
    message = report.message or ""
    # A bound that does not leak, or a map (--all-transitions) of releases that all do not.
    unmoved = message.startswith(NO_TRANSITION) and "leaks (" not in message.splitlines()[0]
    if report.status == "bounds_failed" and ("does not leak" in message or unmoved):
        console.print(
            "hint: a leak that grows less than the threshold during one run counts as clean; "
            "run the repro longer (more steps) or lower --min-growth"
        )


def _notes(row: CandidateRow) -> str:
    notes = []
    if row.yanked:
        notes.append(f"yanked: {printable(row.yanked_reason or 'no reason given')}")
    if not row.testable:
        notes.append(f"untestable: {printable(row.untestable_reason or '')}")
    if row.resolution and row.resolution != "constrained":
        notes.append(f"resolution: {row.resolution}")
    if row.resolution_note and row.resolution_note.startswith(FORCED_NOTE):
        notes.append(printable(row.resolution_note))
    if row.infrastructure:
        notes.append(printable(row.infrastructure))
    if row.reused:
        notes.append("verdict reused")
    contradicted = contradiction_note(row)
    if contradicted:
        notes.append(contradicted)
    return escape("; ".join(notes))


def _candidate_table(report: Report) -> Table:
    table = Table(title="candidates", title_justify="left")
    for name in ("version", "verdict", "trials", "growth MiB", "notes"):
        table.add_column(name)
    for row in report.candidates:
        growth = "" if row.growth_mib is None else f"{row.growth_mib:+.1f}"
        verdict = row.verdict or ("untestable" if not row.testable else "not tested")
        table.add_row(row.version, verdict, str(row.trials), growth, _notes(row))
    return table


def _evidence(console: Console, report: Report, curves: dict[int, list[float]]) -> None:
    for item in report.evidence:
        console.print(f"[bold]evidence {item.version}[/] ({item.verdict})")
        for run in item.runs:
            reason = outside((run.analysis or {}).get("reason", ""))
            console.print(f"  trial {run.trial}: {run.verdict}: {reason}")
            curve = curves.get(run.trial)
            if curve:
                low, high = min(curve) / 2**20, max(curve) / 2**20
                console.print(f"  rss {sparkline(curve)}  {low:.0f}..{high:.0f} MiB")
        if item.pooled:
            console.print(f"  {outside(item.pooled.get('reason', ''))}")


def _dependency_diff(console: Console, report: Report) -> None:
    old_key, new_key = report.names
    if report.dependency_diff:
        diff = Table(title="what else changed between the boundary pair", title_justify="left")
        for name in ("package", old_key, new_key):
            diff.add_column(name)
        for row in report.dependency_diff:
            diff.add_row(row.package, row.old or "-", row.new or "-")
        console.print(diff)
    elif report.evidence and report.last_old and report.first_new:  # no pair: nothing to diff
        console.print(f"no other package changed between {report.last_old} and {report.first_new}")


def _findings(console: Console, report: Report) -> None:
    """--from/--to, --attribute and --commits, each under its question (engine/findings.py)."""
    for _, title, lines in findings.sections(report, frames=2):
        console.print(f"[bold]{title.lower()}[/]")
        for line in lines:
            console.print(outside(line), soft_wrap=True)


def _machine_text(machine: dict[str, Any]) -> str:
    gpu = machine.get("gpu")
    gpu_text = (
        f"{gpu.get('name')} x{gpu.get('count')}, driver {gpu.get('driver')}, CUDA {gpu.get('cuda')}"
        if gpu
        else "none"
    )
    return (
        f"Python {machine['python']}, {machine['os']}, {machine['cpu']} "
        f"({machine['cpus']} CPUs), {machine['memory_bytes'] / 2**30:.1f} GiB; GPU: {gpu_text}"
    )


def _progress_text(report: dict[str, Any]) -> str:
    progress = report.get("progress") or {}
    return (
        f"trials: {progress.get('trials_done', report.get('trials', 0))} done, "
        f"{progress.get('trials_running', 0)} running, {progress.get('trials_queued', 0)} queued"
    )


class JobProgress:
    """Progress of a server-side job, from the report dicts `GET /jobs/{id}` returns.

    The same cells as `LiveDisplay` on a terminal, and the same status line per running trial
    (`status_line`, from the server's `progress.running`: the runner's last heartbeat and the
    server's elapsed time, which ticks on here between polls), redrawn in place; plain lines
    otherwise: a line when a trial starts, its status line at most every PLAIN_EVERY_S. `update`
    is fed each polled report and prints a line per newly judged candidate.
    """

    def __init__(self, console: Console, live: bool) -> None:
        self.console = console
        self.started = time.monotonic()
        self.polled = self.started  # when `report` came
        self.seen: dict[str, tuple[str | None, int]] = {}
        self.report: dict[str, Any] | None = None
        self.last_text = ""
        self.announced: set[int] = set()  # running trials a plain line named
        self.printed = self.started  # the last plain status lines
        self.live = (
            Live(console=console, refresh_per_second=4, transient=True,
                 get_renderable=self._render)
            if live
            else None
        )  # fmt: skip

    def __enter__(self) -> "JobProgress":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)  # type: ignore[arg-type]

    def _running(self) -> list[dict[str, Any]]:
        return ((self.report or {}).get("progress") or {}).get("running") or []

    def _line(self, r: dict[str, Any], now: float) -> str:
        """A running trial's status line, then which trial and runner it is."""
        elapsed = (r.get("elapsed_s") or 0.0) + (now - self.polled)
        memory = {k: r.get(k) for k in LIVE_FIELDS}
        line = status_line(r["version"], elapsed, r.get("early_stop"), **memory)
        return f"{line}  (trial {r['trial']}, {r['runner']})"

    def _render(self) -> Group:
        report = self.report or {}
        rows = report.get("candidates") or []
        running = self._running()
        busy = {r["version"] for r in running}
        row = Text()
        for c in rows:
            row.append_text(cell(c["verdict"], c["testable"], c["version"] in busy))
        span = f"{rows[0]['version']} … {rows[-1]['version']}" if rows else report.get("range", "")
        now = time.monotonic()
        status = (
            f"{report.get('package', '')} {span}   {report.get('status', '')}   "
            f"{_progress_text(report)}   elapsed: {duration(now - self.started)}"
        )
        lines = [Text(f"▶ {self._line(r, now)}", no_wrap=True, overflow="ellipsis")
                 for r in running]  # fmt: skip
        return Group(Text(status), row, *lines)

    def update(self, report: dict[str, Any]) -> None:
        self.report, self.polled = report, time.monotonic()
        for c in report.get("candidates") or []:
            key = (c["verdict"], c["trials"])
            if self.seen.get(c["version"], (None, 0)) != key and c["verdict"] is not None:
                self.console.print(f"  {c['version']}: {c['verdict']} ({c['trials']} trials)")
            self.seen[c["version"]] = key
        if self.live is not None:
            self.live.refresh()
            return
        text = f"{report.get('status')}: {_progress_text(report)}"
        if text != self.last_text:
            self.console.print(text)
            self.last_text = text
        self._plain_lines()

    def _plain_lines(self) -> None:
        """Not a terminal: a line when a trial starts, status lines every PLAIN_EVERY_S."""
        now = time.monotonic()
        running = self._running()
        for r in running:
            if r["trial_id"] not in self.announced:
                self.announced.add(r["trial_id"])
                self.console.print(f"running {r['version']} (trial {r['trial']}, {r['runner']})")
        if running and now - self.printed >= PLAIN_EVERY_S:
            self.printed = now
            for r in running:
                self.console.print(f"  {self._line(r, now)}", soft_wrap=True)
