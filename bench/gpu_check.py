"""The GPU check: the GPU fixtures judged and bisected on this machine's NVIDIA GPU.

    uv run python bench/gpu_check.py                      # on an NVIDIA machine: docs/gpu-check.md
    uv run python bench/gpu_check.py --fake --out DIR     # FAKE driver and NVML (CI, no GPU)

What it does, in order, writing every figure into the report (default docs/gpu-check.md):

1. The machine: GPU model(s) and memory, driver, NVML and CUDA driver versions (NVML),
   the nvidia-ml-py version, which process-query version (v3/v2/v1) the driver answers.
2. What the kernel reports for pinned host pages: `service.example.gpu.pinned_probe`
   allocates 256 MiB with `cuMemHostAlloc` and reads /proc/PID/status, smaps_rollup, psutil
   and the mappings that changed, before and after.
3. Each repro variant once (`service/example/gpu/repro.py`: device-leak, device-plateau,
   pinned-leak, pinned-reuse, oom) under the real executor and sampler
   (`runners.executor.run_script`) and the classifier (`engine.analysis.classify_run`):
   the verdict expected and got, the deciding series, the GPU series' source
   (process/device), floor growths, exit status, wall time.
4. A whole bisection of the GPU fixture index (`gpuleakfixture` 0.1.0..0.1.7, first bad
   0.1.5) served on 127.0.0.1, through the same job, scheduler and local executor as
   `bisect-cli run` (SQLite in the work directory): the candidates visited, expected and got.
5. Sampling overhead: microseconds per GPU query and per sample with and without NVML.

The GPUs count as held exclusively by the check (device-level memory as the fallback when
no per-process figure matches) when NVML lists no process on them at the start
(``--exclusive auto``, the default); ``yes``/``no`` force it.

Exit status: 0 every check passed, 1 some check failed (the report says which), 2 bad
usage, 3 no NVIDIA GPU here (nothing is written).

What it needs (nothing from the network): this repository and its environment (`uv sync`
made `.venv`: Python 3.11+, numpy, scipy, psutil, nvidia-ml-py, sqlmodel, uv...), and the
NVIDIA driver (``libcuda.so.1`` and ``libnvidia-ml.so.1``). No CUDA toolkit, no PyTorch.
docs/gpu-check.md says how to carry it to an offline machine. ``--fake`` also needs gcc.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlmodel import Session  # noqa: E402

from contract.errors import LeakbisectError  # noqa: E402
from engine.analysis import RunAnalysis, classify_run  # noqa: E402
from engine.verdicts import Verdict  # noqa: E402
from runners.envs import find_python  # noqa: E402
from runners.executor import run_script  # noqa: E402
from runners.machine import describe_machine  # noqa: E402
from runners.nvml import GpuProbe, open_probe  # noqa: E402
from runners.sampler import Sampler  # noqa: E402
from runners.trial import LocalExecutor  # noqa: E402
from service.db import get_engine, upgrade  # noqa: E402
from service.example.gpu.fixture import NAME, GpuFixtureSpec, build_gpu_fixture  # noqa: E402
from service.example.gpu.repro import STEPS_ENV, VARIANT_ENV  # noqa: E402
from service.example.index import serve_index  # noqa: E402
from service.jobs import create_job  # noqa: E402
from service.local import Quiet, run_job  # noqa: E402
from service.report import build_report  # noqa: E402
from service.schemas import JobCreate  # noqa: E402
from service.settings import get_settings  # noqa: E402
from service.store import candidates_of, trials_of  # noqa: E402

REPRO = REPO / "service" / "example" / "gpu" / "repro.py"
DEFAULT_OUT = REPO / "docs" / "gpu-check.md"
MIB = 1024 * 1024
RANGE = "0.1.0..0.1.7"
EXPECTED_BOUNDARY = ("0.1.4", "0.1.5")
# One runner: both bounds, binary search, the boundary pair again, then the witness above
# it (engine/planner.py rule 5; see the fixture).
EXPECTED_VISITED = ["0.1.0", "0.1.7", "0.1.3", "0.1.5", "0.1.4", "0.1.4", "0.1.5", "0.1.6"]
NOT_LEAK = (Verdict.CLEAN, Verdict.PLATEAU)


def _leaks(a: Any) -> bool:
    return a is not None and a.verdict is Verdict.LEAK


# variant -> (what is expected, in words; the test of a run's analysis and exit status)
EXPECTED: dict[str, tuple[str, Callable[[RunAnalysis, int | None], bool]]] = {
    "device-leak": (
        "leak, decided by the GPU series",
        lambda r, code: r.verdict is Verdict.LEAK and _leaks(r.gpu),
    ),
    "device-plateau": ("clean or plateau, never leak", lambda r, code: r.verdict in NOT_LEAK),
    "pinned-leak": (
        "leak, decided by the host series; the GPU series does not leak",
        lambda r, code: r.verdict is Verdict.LEAK and _leaks(r.host) and not _leaks(r.gpu),
    ),
    "pinned-reuse": ("clean or plateau (spikes, no leak)", lambda r, code: r.verdict in NOT_LEAK),
    "oom": (
        "leak, the run ending in CUDA out of memory (non-zero exit)",
        lambda r, code: r.verdict is Verdict.LEAK and code not in (0, 125),
    ),
}


@dataclass
class Backend:
    """What the check runs against: the real driver and NVML, or the FAKE ones."""

    fake: bool
    probe: GpuProbe
    env: dict[str, str]  # extra variables for the fixture scripts
    cuda_library: str | None  # baked into the GPU fixture's releases (None: libcuda.so.1)
    exclusive: bool


@dataclass
class Check:
    name: str
    ok: bool
    expected: str
    got: str


@dataclass
class Report:
    backend: Backend
    command: str
    started: datetime
    machine: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    variants: list[dict[str, Any]] = field(default_factory=list)
    bisection: dict[str, Any] = field(default_factory=dict)
    pinned: dict[str, Any] | str = ""
    overhead: dict[str, float] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------- backends


def _open_probe(nvml: Any, exclusive: str) -> tuple[GpuProbe, bool] | None:
    """A probe, and whether the GPUs count as held exclusively (see --exclusive)."""
    probe = open_probe(exclusive, nvml)
    return (probe, probe.exclusive_indices is not None) if probe is not None else None


@contextlib.contextmanager
def real_backend(exclusive: str) -> Iterator[Backend | None]:
    import pynvml

    opened = _open_probe(pynvml, exclusive)
    if opened is None:
        yield None
        return
    probe, held = opened
    try:
        yield Backend(False, probe, {}, None, held)
    finally:
        probe.close()


@contextlib.contextmanager
def fake_backend(work: Path, exclusive: str) -> Iterator[Backend | None]:
    """The FAKE CUDA driver and FAKE libnvidia-ml (tests/), the real pynvml on top."""
    from tests.fake_cuda import LIBRARY_ENV, build_fake_cuda, build_fake_libnvml, load_fake_libnvml

    cuda = build_fake_cuda(work / "fake-cuda")
    nvml_lib = build_fake_libnvml(work / "fake-nvml", cuda.usage_dir, total_mib=cuda.total_mib)
    with load_fake_libnvml(nvml_lib) as pynvml:
        opened = _open_probe(pynvml, exclusive)
        assert opened is not None, "the FAKE NVML always has one device"
        probe, held = opened
        try:
            yield Backend(True, probe, {LIBRARY_ENV: str(cuda.library)}, str(cuda.library), held)
        finally:
            probe.close()


# ---------------------------------------------------------------------------- the checks


def machine_facts(backend: Backend) -> dict[str, Any]:
    info = backend.probe.describe()
    try:
        binding = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        binding = None
    gpus = [f"{d['name']} ({(d['memory_total'] or 0) / 2**30:.1f} GiB)" for d in info["devices"]]
    return {
        "GPUs": ", ".join(gpus),
        "driver": info.get("driver_version"),
        "NVML": info.get("nvml_version"),
        "CUDA (driver API)": info.get("cuda_driver_version"),
        "nvidia-ml-py": binding,
        "held exclusively": "yes" if backend.exclusive else "no (other processes listed)",
        "Python": platform.python_version(),
        "OS": f"{platform.system()} {platform.release()}",
        "CPU": describe_machine(backend.probe).get("cpu"),
        "CPUs": os.cpu_count(),
    }


def _growth(series: Any) -> str:
    value = None if series is None else getattr(series, "growth_mib", None)
    return "n/a" if value is None else f"{value:.0f} MiB"


def run_variant(backend: Backend, name: str, work: Path) -> tuple[Check, dict[str, Any]]:
    """Run one variant under the executor and sampler; judge it; compare with EXPECTED."""
    env = {**os.environ, **backend.env, VARIANT_ENV: name}
    t0 = time.monotonic()
    ex = run_script(
        find_python(None), REPRO, cwd=work, timeout_s=600, memory_limit_bytes=None,
        env=env, gpu=backend.probe, name=f"gpu-check-{name}",
    )  # fmt: skip
    wall = time.monotonic() - t0
    samples = ex.samples
    gpu = [s.gpu for s in samples] if ex.gpu_source != "unavailable" else None
    r = classify_run(
        [s.t for s in samples], [s.rss for s in samples], gpu, ex.steps,
        exit_code=ex.exit_code, oom_killed=ex.oom_killed, timed_out=ex.timed_out,
    )  # fmt: skip
    expected, test = EXPECTED[name]
    shared = [s.shared for s in samples if s.shared is not None]
    gpu_values = [v for v in gpu or [] if v is not None]
    row = {
        "variant": name,
        "expected": expected,
        "verdict": r.verdict.value,
        "host": r.host.verdict.value,
        "gpu": r.gpu.verdict.value if r.gpu else "unavailable",
        "gpu_source": ex.gpu_source,
        "exit": ex.exit_code,
        "host_growth": _growth(r.host),
        "gpu_growth": _growth(r.gpu),
        "shared_range": f"{min(shared) / MIB:.0f} -> {max(shared) / MIB:.0f} MiB"
        if shared
        else "n/a",
        "gpu_range": (
            f"{min(gpu_values) / MIB:.0f} -> {max(gpu_values) / MIB:.0f} MiB"
            if gpu_values
            else "n/a"
        ),
        "samples": len(samples),
        "steps": len(ex.steps),
        "wall_s": wall,
        "reason": r.reason,
    }
    got = f"{r.verdict.value} (host {row['host']}, gpu {row['gpu']} from {ex.gpu_source})"
    return Check(name, test(r, ex.exit_code), expected, got), row


def bisect_fixture(backend: Backend, work: Path, uv_cache: Path) -> tuple[Check, dict[str, Any]]:
    """The GPU fixture index bisected through the local flow of `bisect-cli run`."""
    spec = GpuFixtureSpec(cuda_library=backend.cuda_library)
    wheels = build_gpu_fixture(work / "gpu-index", spec)
    url = f"sqlite:///{work / 'gpu-check.db'}"
    upgrade(url)
    t0 = time.monotonic()
    with serve_index(wheels) as index, Session(get_engine(url)) as session:
        request = JobCreate(
            package=NAME, range=RANGE, script=REPRO.read_text(), script_name="repro.py",
            index_url=index, reuse_verdicts=False,
        )  # fmt: skip
        job = create_job(session, request, machine=describe_machine(backend.probe), local=True)
        progress = Quiet()
        executor = LocalExecutor(work / "envs", uv_cache, backend.probe)
        run_job(session, job, executor=executor, progress=progress)
        report = build_report(job, candidates_of(session, job), trials_of(session, job)).wire()
        trials = [(t.verdict, t.gpu_source) for t in trials_of(session, job) if t.kind == "run"]
    wall = time.monotonic() - t0
    boundary = (report.get("last_good"), report.get("first_bad"))
    ok = (
        report["status"] == "found"
        and boundary == EXPECTED_BOUNDARY
        and progress.visited == EXPECTED_VISITED
    )
    facts = {
        "status": report["status"],
        "boundary": boundary,
        "visited": progress.visited,
        "trials": trials,
        "wall_s": wall,
        "message": report.get("message"),
    }
    expected = (
        f"found: last good {EXPECTED_BOUNDARY[0]}, first bad {EXPECTED_BOUNDARY[1]}; "
        f"visited {', '.join(EXPECTED_VISITED)}"
    )
    got = f"{report['status']}: last good {boundary[0]}, first bad {boundary[1]}; visited " + (
        ", ".join(progress.visited)
    )
    return Check("bisection", ok, expected, got), facts


def pinned_report(backend: Backend, mib: int = 256) -> dict[str, Any] | str:
    """The kernel's counters around `mib` MiB of cuMemHostAlloc (or why they are missing)."""
    proc = subprocess.run(
        [sys.executable, "-m", "service.example.gpu.pinned_probe", "--mib", str(mib)],
        cwd=REPO, env={**os.environ, **backend.env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        return f"pinned_probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    return json.loads(proc.stdout)


def sampling_overhead(backend: Backend, n: int = 300) -> dict[str, float]:
    """Microseconds per GPU query and per sample of a small process, with and without NVML."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.3)
        t0 = time.perf_counter()
        for _ in range(n):
            backend.probe.sample({child.pid})
        gpu_us = (time.perf_counter() - t0) / n * 1e6
        per_sample = {}
        for label, probe in (("host only", None), ("host + GPU", backend.probe)):
            sampler = Sampler(child.pid, gpu=probe).attach()
            t0 = time.perf_counter()
            for _ in range(n):
                sampler.sample_once()
            per_sample[label] = (time.perf_counter() - t0) / n * 1e6
    finally:
        child.kill()
        child.wait()
    return {
        "GpuProbe.sample (us)": gpu_us,
        "Sampler.sample_once, host only (us)": per_sample["host only"],
        "Sampler.sample_once, host + GPU (us)": per_sample["host + GPU"],
        "CPU share at 10 Hz, host + GPU (%)": per_sample["host + GPU"] * 10 / 1e4,
        "CPU share at 50 Hz, host + GPU (%)": per_sample["host + GPU"] * 50 / 1e4,
    }


# ---------------------------------------------------------------------------- the report


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out + [""]


def _pinned_section(pinned: dict[str, Any] | str) -> list[str]:
    lines = ["## Pinned host memory: what the kernel reports", ""]
    if isinstance(pinned, str):
        return lines + [f"Not measured: {pinned}", ""]
    lines += [
        f"{pinned['pinned_mib']} MiB allocated with `cuMemHostAlloc` on {pinned['device']} "
        f"(`{pinned['library']}`), every byte written; counters in KiB.",
        "",
    ]
    rows = []
    for source in ("status", "smaps_rollup", "psutil"):
        part = pinned[source]
        rows += [
            [source, k, part["before"].get(k), v, part["after"].get(k)]
            for k, v in part["delta"].items()
        ]
    lines += _table(["source", "counter", "before", "change", "after"], rows)
    mapped = [[path, d.get("Size"), d.get("Rss")] for path, d in pinned["mappings"].items()]
    lines += ["Mappings that changed (KiB):", ""] + _table(["backing file", "Size", "Rss"], mapped)
    return lines


def render(rep: Report) -> str:
    passed = sum(c.ok for c in rep.checks)
    fake = rep.backend.fake
    lines = ["# GPU check" + (" (FAKE run, no GPU)" if fake else ""), ""]
    if fake:
        lines += [
            "> **FAKE**: this report comes from the FAKE CUDA driver (tests/fake_cuda.c) and the",
            "> FAKE libnvidia-ml (tests/fake_libnvml.c) under the real pynvml. It says that the",
            "> check runs end to end, nothing about a real GPU.",
            "",
        ]
    lines += [
        f"Run {rep.started:%Y-%m-%d %H:%M} UTC with `{rep.command}`: "
        f"**{passed} of {len(rep.checks)} checks passed**.",
        "",
        "## Machine",
        "",
    ]
    lines += _table(["", ""], [[k, v] for k, v in rep.machine.items()])
    lines += ["## Verdicts", ""]
    lines += [
        f"- `{c.name}`: {'PASS' if c.ok else 'FAIL'}: expected {c.expected}; got {c.got}"
        for c in rep.checks
    ] + [""]
    cols = ["variant", "verdict", "host", "gpu", "GPU source", "exit", "host growth",
            "GPU growth", "shared", "GPU memory", "samples", "steps", "wall"]  # fmt: skip
    keys = ["variant", "verdict", "host", "gpu", "gpu_source", "exit", "host_growth",
            "gpu_growth", "shared_range", "gpu_range", "samples", "steps"]  # fmt: skip
    rows = [[v[k] for k in keys] + [f"{v['wall_s']:.1f} s"] for v in rep.variants]
    lines += _table(cols, rows)
    lines += ["Classifier reasons:", ""] + [
        f"- `{v['variant']}`: {v['reason']}" for v in rep.variants
    ]
    b = rep.bisection
    lines += ["", "## Bisection", ""]
    if b:
        lines += [
            f"`{NAME}` {RANGE} from a local index on 127.0.0.1, one local runner: "
            f"{b['status']} in {b['wall_s']:.1f} s, {len(b['trials'])} trials.",
            "",
        ]
        lines += _table(
            ["trial", "version", "verdict", "GPU source"],
            [
                [i + 1, v, t[0], t[1]]
                for i, (v, t) in enumerate(zip(b["visited"], b["trials"], strict=False))
            ],
        )
    lines += _pinned_section(rep.pinned)
    lines += ["## Sampling overhead", ""]
    lines += _table(["measure", "value"], [[k, f"{v:.1f}"] for k, v in rep.overhead.items()])
    lines += ["## Wall times", ""]
    lines += _table(["part", "seconds"], [[k, f"{v:.1f}"] for k, v in rep.wall.items()])
    lines += [
        "## How to run it again",
        "",
        "`uv run python bench/gpu_check.py` on any NVIDIA machine; it needs this repository's",
        "environment (`uv sync`), Python 3.11+ and the NVIDIA driver, nothing from the network.",
        "docs/gpu.md says how GPU leaks are judged and how to carry it to an offline machine.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


def _timed(rep: Report, label: str, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        rep.wall[label] = time.monotonic() - t0


def run_checks(backend: Backend, work: Path, uv_cache: Path, command: str) -> Report:
    rep = Report(backend, command, datetime.now(UTC))
    rep.machine = machine_facts(backend)
    rep.pinned = _timed(rep, "pinned-memory probe", lambda: pinned_report(backend))
    for name in EXPECTED:
        check, row = _timed(rep, f"variant {name}", lambda n=name: run_variant(backend, n, work))
        rep.checks.append(check)
        rep.variants.append(row)
    check, rep.bisection = _timed(rep, "bisection", lambda: bisect_fixture(backend, work, uv_cache))
    rep.checks.append(check)
    rep.overhead = _timed(rep, "overhead", lambda: sampling_overhead(backend))
    versions = backend.probe.query_versions()
    rep.machine["process queries"] = ", ".join(f"{k} {v or 'none'}" for k, v in versions.items())
    return rep


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python bench/gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the report to write (default {DEFAULT_OUT.relative_to(REPO)}; "
        "required with --fake, so a FAKE run never overwrites the docs)",
    )
    ap.add_argument(
        "--fake",
        action="store_true",
        help="run against the FAKE CUDA driver and FAKE libnvidia-ml (needs gcc)",
    )
    ap.add_argument(
        "--exclusive",
        choices=("auto", "yes", "no"),
        default="auto",
        help="treat the GPUs as held by the check alone (device-level fallback); "
        "auto: when NVML lists no process on them at the start",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per variant run ({STEPS_ENV}; default the repro's 40)",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="work directory (environments, index, database); default a temporary one",
    )
    args = ap.parse_args(argv)
    if args.fake and args.out is None:
        ap.error("--fake needs --out FILE (a FAKE run must not overwrite docs/gpu-check.md)")
    if args.steps is not None and args.steps < 8:
        ap.error(f"--steps: {args.steps} is too few; the classifier needs at least 8 steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or DEFAULT_OUT
    if args.steps is not None:
        os.environ[STEPS_ENV] = str(args.steps)  # the variant runs and the bisection's trials
    command = "uv run python bench/gpu_check.py" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    uv_cache = Path(os.environ.get("UV_CACHE_DIR") or get_settings().uv_cache_dir)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        # Run as root, the trials build and run as the sandbox users: they must enter it.
        work.chmod(0o755)
        backend_cm = (
            fake_backend(work, args.exclusive) if args.fake else real_backend(args.exclusive)
        )
        backend = stack.enter_context(backend_cm)
        if backend is None:
            print(
                "gpu_check: no NVIDIA GPU here: NVML found no driver or no device", file=sys.stderr
            )
            return 3
        try:
            rep = run_checks(backend, work, uv_cache, command)
        except LeakbisectError as exc:  # e.g. a work directory the sandbox users cannot reach
            print(f"gpu_check: {exc}", file=sys.stderr)
            return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rep) + "\n")
    failed = [c.name for c in rep.checks if not c.ok]
    print(f"gpu_check: {len(rep.checks) - len(failed)} of {len(rep.checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; report: {out}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
