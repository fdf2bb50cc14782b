"""The job's report as Markdown, ready to paste into an upstream issue.

One function, `markdown_report(report, url)`, read by `bisect-cli report JOB --markdown`,
`GET /api/v1/jobs/{id}/report.md` and the status page's "Copy as Markdown" button, so all
three say the same. It renders the same typed `Report` (service/schemas.py) as the CLI's text
report: the answer, the range, every release tested with its verdict, the boundary pair's
numbers, the dependency diff, the machine and the reproduce command.

Everything that came from outside (messages, uv's notes, requirements) is escaped for
Markdown and stripped of control characters: pasted into GitHub it stays text, never a link,
an image or HTML.
"""

import re
from typing import Any

from engine import findings
from engine.verdicts import NO_TRANSITION
from service.schemas import Evidence, Report, contradiction_note, transition_line
from service.text import printable

_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def md_text(text: str | None) -> str:
    """Outside text as inline Markdown: one line, every special character escaped."""
    flat = " ".join(printable(text or "").split())
    return _SPECIAL.sub(r"\\\1", flat)


def md_code(text: str) -> str:
    """Inline code that no backtick in `text` can close early."""
    flat = " ".join(printable(text).split())
    longest = max((len(m) for m in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def md_block(text: str, lang: str = "") -> str:
    """A fenced block longer than any fence inside `text`."""
    body = printable(text).rstrip("\n")
    longest = max((len(m) for m in re.findall(r"^`{3,}", body, flags=re.M)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def headline(report: Report) -> str:
    """The answer in one sentence (the page's banner says the same)."""
    old_name, new_name = (n.replace("_", " ") for n in report.names)
    if report.status == "found":
        runs = {e.version: len(e.runs) for e in report.evidence}
        confirmed = ""
        if runs:
            least = min(runs.values())
            confirmed = {1: "", 2: ", confirmed twice"}.get(least, f", confirmed {least} times")
        return f"{new_name} {report.first_new}, {old_name} {report.last_old}{confirmed}"
    if report.status == "bounds_failed":
        first = _first_line(report.message)
        # A mapped range (--all-transitions) with no transition: no bound failed, the map
        # found nothing, and its line says so.
        return first if first.startswith(NO_TRANSITION) else f"a bound failed its check: {first}"
    if report.status == "inconclusive":
        if not report.between:  # a bound that could not be judged or confirmed
            return f"inconclusive: {_first_line(report.message)}"
        between = ", ".join(report.between)
        return f"inconclusive: only unjudgeable releases separate the pair ({between})"
    if report.status in ("queued", "running"):
        return f"{report.status}: no answer yet"
    return f"{report.status.replace('_', ' ')}: {_first_line(report.message)}"


def _first_line(text: str | None) -> str:
    return printable(text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _candidates(report: Report) -> list[str]:
    lines = [
        "| release | verdict | runs | floor growth (MiB) | note |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for row in report.candidates:
        untried = row.trials == 0 and row.verdict is None and not row.infrastructure
        if untried and row.testable and not row.yanked:
            continue  # never tested: the table lists what was tested (or tried to)
        notes = []
        if row.version == report.first_new or row.version == report.last_old:
            name = report.names[1] if row.version == report.first_new else report.names[0]
            notes.append(f"**{name.replace('_', ' ')}**")
        if row.yanked:
            notes.append(f"yanked{': ' + md_text(row.yanked_reason) if row.yanked_reason else ''}")
        if not row.testable:
            notes.append(f"untestable: {md_text(row.untestable_reason)}")
        if row.infrastructure:
            notes.append(md_text(row.infrastructure))
        if row.reused:
            notes.append("verdict reused from an earlier job")
        contradicted = contradiction_note(row)
        if contradicted:
            notes.append(contradicted)
        if row.resolution == "free":
            notes.append("resolved freely (other packages not held at the good bound's)")
        lines.append(
            f"| {md_text(row.version)} | {row.verdict or ''} | {row.trials} "
            f"| {_fmt(row.growth_mib)} | {'; '.join(notes)} |"
        )
    return lines


def _series_numbers(series: dict[str, Any] | None) -> str:
    if not series:
        return ""
    unit = series.get("unit") or "MiB/s"
    parts = []
    if series.get("growth_mib") is not None:
        parts.append(f"growth {series['growth_mib']:.1f} MiB")
    if series.get("slope") is not None:
        low, high = series.get("slope_low"), series.get("slope_high")
        ci = f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None else ""
        parts.append(f"slope {series['slope']:.3g}{ci} {unit}")
    if series.get("baseline_mib") is not None:
        parts.append(f"baseline {series['baseline_mib']:.1f} MiB")
    return ", ".join(parts)


def _evidence(items: list[Evidence]) -> list[str]:
    lines = [
        "| release | trial | verdict | host floor | GPU floor | exit | duration |",
        "| --- | ---: | --- | --- | --- | ---: | ---: |",
    ]
    for item in items:
        for run in item.runs:
            analysis = run.analysis or {}
            exit_text = (
                "OOM-killed"
                if run.oom_killed
                else ("" if run.exit_code is None else str(run.exit_code))
            )
            host, gpu = _series_numbers(analysis.get("host")), _series_numbers(analysis.get("gpu"))
            took = "" if run.duration_s is None else f"{run.duration_s:.1f} s"
            lines.append(
                f"| {md_text(item.version)} | {run.trial} | {run.verdict or ''} "
                f"| {host} | {gpu} | {exit_text} | {took} |"
            )
    pooled = [(item.version, item.pooled["reason"]) for item in items if item.pooled]
    if pooled:
        lines.append("")
        lines += [f"- {md_text(version)}: {md_text(reason)}" for version, reason in pooled]
    return lines


def _machine(machine: dict[str, Any]) -> str:
    # The host name stays out: the report goes to a public issue.
    shown = {k: v for k, v in machine.items() if k != "hostname" and v not in (None, "", [], {})}
    if isinstance(shown.get("memory_bytes"), int):
        shown["memory"] = f"{shown.pop('memory_bytes') / 2**30:.1f} GiB"
    return "; ".join(f"{md_text(k)}: {md_text(str(v))}" for k, v in shown.items())


def markdown_report(report: Report, url: str | None = None) -> str:
    """The paste-ready Markdown of `report`; `url`: the job's status page, linked when given."""
    title = f"### leakbisect: {md_code(report.package)} {md_text(report.range)}"
    out = [title, "", f"**{md_text(headline(report))}**", ""]
    direction = "first release that no longer leaks" if report.find_fix else "first leaking release"
    out.append(
        f"Bisected {md_code(report.package)} over {md_text(report.range)} for the {direction}: "
        f"{report.trials} runs of the repro script"
        + (f", job {report.job_id}" if report.job_id is not None else "")
        + (f" ([status page and memory curves]({url}))" if url else "")
        + "."
    )
    message = _first_line(report.message)
    if message and report.status == "found":
        out += ["", md_text(message)]
    if report.not_monotone:
        out += ["", f"**{md_text(report.not_monotone)}**"]
    if len(report.transitions) > 1:
        out += ["", "Transitions:", ""]
        out += [f"- {md_text(transition_line(row))}" for row in report.transitions]
    if report.between:
        out += ["", f"Unjudgeable releases between the pair: {md_text(', '.join(report.between))}"]
    out += ["", "#### Releases tested", "", *_candidates(report)]
    if report.evidence:
        out += ["", "#### The boundary pair's runs", "", *_evidence(report.evidence)]
    if report.dependency_diff:
        old, new = (n.replace("_", " ") for n in report.names)
        out += [
            "",
            f"#### Other packages that changed between {md_text(report.last_old)} and "
            f"{md_text(report.first_new)}",
            "",
            f"| package | {old} | {new} |",
            "| --- | --- | --- |",
        ]
        out += [
            f"| {md_text(d.package)} | {md_text(d.old or '(absent)')} "
            f"| {md_text(d.new or '(absent)')} |"
            for d in report.dependency_diff
        ]
    elif report.evidence:
        out += [
            "",
            f"No other package changed between {md_text(report.last_old)} and "
            f"{md_text(report.first_new)}.",
        ]
    for _, title, lines in findings.sections(report, frames=2):
        # A code block: stacks and mixes stay aligned.
        out += ["", f"#### {title}", "", md_block("\n".join(lines))]
    if report.machine:
        out += ["", "#### Machine", "", _machine(report.machine)]
    if report.reproduce:
        out += ["", "#### Reproduce", "", md_block(report.reproduce, "console")]
    out += ["", "_Made by leakbisect._", ""]
    return "\n".join(out)
