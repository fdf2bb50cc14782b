"""The live progress display and the final report, drawn with Rich on the terminal.

The running trial of `bisect-cli run` has a status line (`TrialWatch.line`): its candidate,
the time since it started, the steps its markers span, its memory now and its floor (the
lowest memory of each step, or of each second while no step marker was seen, the set-up
before the first marker then dropped: the first complete one's -> the latest's), and what
the early-stop rule can do now (contract/earlystop.py `live_state`). On a terminal it is
redrawn in place (`LiveDisplay`); otherwise a plain line every PLAIN_EVERY_S at most
(`LineProgress`). Samples come from the executor's thread; with `run --jobs N` they carry no
trial, so the line then has no memory. Nothing here writes to stdout (`--json` owns it).

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

from contract.wire import EarlyStop, Sample, TrialSpec
from engine import findings
from engine.baseenv import FORCED_NOTE
from engine.verdicts import Verdict
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


@dataclass
class TrialWatch:
    """One running trial as its status line shows it (the module docstring says what)."""

    label: str  # the candidate's version
    started: float  # time.monotonic() when it started
    early_stop: EarlyStop | None
    last: Sample | None = None
    first_step: int | None = None
    first_floor: int | None = None
    floor: int | None = None
    # The step being seen (("s", second) before any marker) and its lowest memory so far.
    window: tuple[str, int] | None = field(default=None, repr=False)
    window_low: int = field(default=0, repr=False)

    @classmethod
    def of(cls, candidate: "Candidate", trial: "Trial", spec: TrialSpec) -> "TrialWatch":
        return cls(candidate.version, time.monotonic(), spec.early_stop)

    def add(self, sample: Sample) -> None:
        if sample.step is not None and self.first_step is None:
            # The first marker: what came before it is set-up, never a floor.
            self.first_step, self.first_floor, self.floor = sample.step, None, None
            self.window = None
        key = ("step", sample.step) if sample.step is not None else ("s", int(sample.t))
        if key == self.window:
            self.window_low = min(self.window_low, sample.rss)
        else:
            if self.window is not None:  # the step (second) before this one is complete
                self.floor = self.window_low
                if self.first_floor is None:
                    self.first_floor = self.floor
            self.window, self.window_low = key, sample.rss
        self.last = sample

    def steps(self) -> int:
        if self.last is None or self.last.step is None or self.first_step is None:
            return 0
        return self.last.step - self.first_step + 1

    def line(self, now: float) -> str:
        """1.0.6  elapsed 12s  37 steps  52 MiB, floor 48→50  early stop: cap only"""
        parts = [self.label, f"elapsed {duration(now - self.started)}"]
        if self.last is not None:
            parts.append(f"{self.steps()} steps")
            memory = f"{self.last.rss / MIB:.0f} MiB"
            if self.floor is not None and self.first_floor is not None:
                memory += f", floor {self.first_floor / MIB:.0f}→{self.floor / MIB:.0f}"
            parts.append(memory)
        # numpy, imported by the rules module: `run` has it, the client never draws this line.
        from contract.earlystop import live_state

        parts.append(f"early stop: {live_state(self.early_stop, self.steps())}")
        return "  ".join(parts)


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
    if report.status == "bounds_failed" and "does not leak" in (report.message or ""):
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

    The same cells as `LiveDisplay` on a terminal (without the live memory
    line: the server has the samples), plain lines otherwise; `update` is fed
    each polled report and prints a line per newly judged candidate.
    """

    def __init__(self, console: Console, live: bool) -> None:
        self.console = console
        self.started = time.monotonic()
        self.seen: dict[str, tuple[str | None, int]] = {}
        self.report: dict[str, Any] | None = None
        self.last_text = ""
        self.live = (
            Live(Text(""), console=console, refresh_per_second=4, transient=True) if live else None
        )

    def __enter__(self) -> "JobProgress":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)  # type: ignore[arg-type]

    def _render(self) -> Group:
        report = self.report or {}
        rows = report.get("candidates") or []
        running = (report.get("progress") or {}).get("running") or []
        busy = {r["version"] for r in running}
        row = Text()
        for c in rows:
            row.append_text(cell(c["verdict"], c["testable"], c["version"] in busy))
        span = f"{rows[0]['version']} … {rows[-1]['version']}" if rows else report.get("range", "")
        elapsed = time.monotonic() - self.started
        status = (
            f"{report.get('package', '')} {span}   {report.get('status', '')}   "
            f"{_progress_text(report)}   elapsed: {elapsed:5.0f}s"
        )
        lines = [Text(status), row]
        for r in running:
            memory = "" if r.get("rss") is None else f"   rss {r['rss'] / 2**20:8.1f} MiB"
            lines.append(
                Text(f"running {r['version']} (trial {r['trial']}, {r['runner']}){memory}")
            )
        return Group(*lines)

    def update(self, report: dict[str, Any]) -> None:
        self.report = report
        for c in report.get("candidates") or []:
            key = (c["verdict"], c["trials"])
            if self.seen.get(c["version"], (None, 0)) != key and c["verdict"] is not None:
                self.console.print(f"  {c['version']}: {c['verdict']} ({c['trials']} trials)")
            self.seen[c["version"]] = key
        if self.live is not None:
            self.live.update(self._render())
            return
        text = f"{report.get('status')}: {_progress_text(report)}"
        if text != self.last_text:
            self.console.print(text)
            self.last_text = text
