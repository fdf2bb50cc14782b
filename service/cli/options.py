"""Options shared by `run` and `submit`: one definition, one help text."""

from pathlib import Path
from typing import Annotated

import typer

from service.units import SIZE_HELP

Package = Annotated[str | None, typer.Option("--package", "-p", help="Package to bisect.")]
Range = Annotated[
    str | None,
    typer.Option(
        "--range",
        help="GOOD..BAD, both ends included (with --find-fix: OLD..NEW, OLD leaks).",
    ),
]
IndexUrl = Annotated[
    str | None,
    typer.Option("--index-url", help="Simple index to list and install from (default PyPI)."),
]
ExtraIndexUrl = Annotated[
    list[str] | None, typer.Option("--extra-index-url", help="Another index; repeatable.")
]
FindLinks = Annotated[
    list[str] | None, typer.Option("--find-links", help="Directory of wheels/sdists; repeatable.")
]
With = Annotated[
    list[str] | None,
    typer.Option("--with", help="Another requirement of the repro, e.g. 'numpy<2'; repeatable."),
]
RequirementsFile = Annotated[
    Path | None, typer.Option("--requirements", "-r", help="File of further requirements.")
]
Python = Annotated[
    str | None, typer.Option("--python", help="Python version for the environments, e.g. 3.12.")
]
Pre = Annotated[bool, typer.Option("--pre", help="Include pre-releases in the range.")]
SkipYanked = Annotated[bool, typer.Option("--skip-yanked", help="Drop yanked releases.")]
AsReleased = Annotated[
    bool,
    typer.Option(
        "--as-released",
        help="Resolve each candidate as on its upload day (uv --exclude-newer) instead of "
        "holding other packages at the good bound's versions.",
    ),
]
FindFix = Annotated[
    bool, typer.Option("--find-fix", help="Find the first release that no longer leaks.")
]
Repeats = Annotated[int, typer.Option("--repeats", min=1, max=20, help="Runs per candidate.")]
MaxRuns = Annotated[
    int,
    typer.Option("--max-runs", min=1, max=50, help="Runs per candidate while inconclusive."),
]
Timeout = Annotated[
    float, typer.Option("--timeout", min=1, help="Seconds one run may take before it is killed.")
]
MemoryLimit = Annotated[
    str | None,
    typer.Option("--memory-limit", help=f"Hard cap per run: {SIZE_HELP} (default 80% of RAM)."),
]
SampleHz = Annotated[
    float,
    typer.Option(
        "--sample-hz",
        min=0.1,
        max=100,
        help="Memory samples per second (50 per second for the first 30 s of a run).",
    ),
]
MinGrowth = Annotated[
    float | None,
    typer.Option(
        "--min-growth",
        min=0.001,
        help="MiB the memory floor must grow over a run to count as a leak (default 8).",
    ),
]
MinGrowthFraction = Annotated[
    float | None,
    typer.Option(
        "--min-growth-fraction",
        min=0,
        help="Growth as a fraction of the baseline floor that must also be exceeded "
        "(default 0.05).",
    ),
]
Reuse = Annotated[
    bool,
    typer.Option(
        "--reuse/--no-reuse",
        help="Reuse verdicts of earlier jobs judged under the same conditions "
        "(script, package, version, environment, classifier, hardware class).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="BISECT_DATABASE_URL",
        help="Where results go (default: SQLite in the per-user data folder).",
    ),
]
