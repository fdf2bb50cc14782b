"""runners/attribution.py: per-stack growth compared between the boundary pair (pure), and
the helper's own pieces that need no trial (runners/tracehelper.py)."""

import io
import json
import subprocess
import sys
from pathlib import Path

from runners import tracehelper
from runners.attribution import MIB, NATIVE_NOTE, compare, growth, headline

LEAK = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 30, "step"],
        ["leakyfixture/__init__.py", 22, "_touched"]]  # fmt: skip
CACHE = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 41, "step"]]
HELPER = [["repro.py", 30, "helper"], ["json/decoder.py", 353, "raw_decode"]]


def profile(*stacks: tuple[list, list[int]]) -> dict:
    n = len(stacks[0][1]) if stacks else 0
    return {
        "tracer": "tracemalloc",
        "error": None,
        "snapshots": [{"t": float(i), "step": i} for i in range(n)],
        "stacks": [{"frames": frames, "sizes": sizes} for frames, sizes in stacks],
    }


def test_growth_is_counted_after_the_first_third_and_per_interval() -> None:
    # Cache: fills in the first third, then flat. Leak: 1 MiB per snapshot throughout.
    found = growth(profile((CACHE, [0, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB]),
                           (LEAK, [i * MIB for i in range(7)])))  # fmt: skip
    key = lambda frames: tuple((f, n, fn) for f, n, fn in frames)  # noqa: E731
    assert found[key(CACHE)] == (0, 0.0)
    assert found[key(LEAK)] == (4 * MIB, 1.0)


def test_the_stack_that_grows_in_the_first_bad_release_only_is_named_at_its_package_line() -> (
    None
):
    good = profile((CACHE, [0, 4 * MIB] + [4 * MIB] * 5), (HELPER, [MIB] * 7))
    bad = profile((CACHE, [0, 4 * MIB] + [4 * MIB] * 5), (HELPER, [MIB] * 7),
                  (LEAK, [i * MIB for i in range(7)]))  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="tracemalloc", rss_growth_bytes=5 * MIB)
    assert found == {
        "tracer": "tracemalloc",
        "available": True,
        "note": None,
        "stacks": [
            {
                "site": "leakyfixture/__init__.py:22 in _touched",
                "in_package": True,
                "growth_bytes": 4 * MIB,
                "good_growth_bytes": 0,
                "grew_in": 1.0,
                "frames": [
                    "leakyfixture/__init__.py:22 in _touched",
                    "leakyfixture/__init__.py:30 in step",
                    "repro.py:24 in main",
                ],
            }
        ],
    }
    assert headline(found) == (
        "grows at leakyfixture/__init__.py:22 in _touched (+4.0 MiB, tracemalloc)"
    )


def test_a_stack_that_grows_as_much_in_the_last_good_release_is_not_blamed() -> None:
    both = profile((LEAK, [i * MIB for i in range(7)]))
    found = compare(both, both, "leakyfixture", tracer="tracemalloc")
    assert (found["stacks"], found["note"]) == (
        [], "no stack grows in the first bad release and not in the last good one"
    )  # fmt: skip


def test_rss_growth_that_no_python_stack_explains_is_called_native() -> None:
    flat = profile((CACHE, [4 * MIB] * 7))
    found = compare(flat, flat, "leakyfixture", tracer="tracemalloc", rss_growth_bytes=40 * MIB)
    assert found["note"] == (
        f"{NATIVE_NOTE}: the stacks explain 0.0 MiB of 40.0 MiB of RSS growth"
    )
    assert found["stacks"] == [] and headline(found) is None


def test_outside_the_package_the_site_is_the_innermost_frame() -> None:
    bad = profile((HELPER, [0, 0, MIB, 2 * MIB]))
    found = compare(profile((HELPER, [0, 0, 0, 0])), bad, "orbax-checkpoint", tracer="tracemalloc")
    assert [(s["site"], s["in_package"]) for s in found["stacks"]] == [
        ("json/decoder.py:353 in raw_decode", False)
    ]


def test_a_memray_profile_grows_by_what_is_live_at_the_end() -> None:
    native = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 57, "_native"],
              ["leak.c", 5, "leak"]]  # fmt: skip
    good = {"tracer": "memray", "snapshots": [{"t": 2.0}], "stacks": []}
    bad = {"tracer": "memray", "snapshots": [{"t": 2.0}],
           "stacks": [{"frames": native, "sizes": [40 * MIB]}]}  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="memray", rss_growth_bytes=40 * MIB)
    assert [(s["site"], s["growth_bytes"], s["grew_in"]) for s in found["stacks"]] == [
        ("leakyfixture/__init__.py:57 in _native", 40 * MIB, None)
    ]
    assert found["stacks"][0]["frames"][0] == "leak.c:5 in leak"


def test_a_missing_or_failed_profile_is_unavailable_with_its_reason() -> None:
    failed = {"tracer": "memray", "error": "memray did not install: no wheel for musl"}
    assert compare(profile(), failed, "x", tracer="memray") == {
        "tracer": "memray", "available": False, "note": "memray did not install: no wheel for musl",
        "stacks": [],
    }  # fmt: skip
    assert compare(None, profile(), "x", tracer="tracemalloc")["note"] == (
        "the traced run wrote no profile"
    )


def test_frames_are_named_relative_to_site_packages_and_by_their_def(tmp_path: Path) -> None:
    module = tmp_path / "lib" / "site-packages" / "pkg" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text("def outer():\n    x = 1\n\n    def inner():\n        return x\n"
                      "    return inner\n")  # fmt: skip
    assert tracehelper.relative(str(module)) == "pkg/mod.py"
    assert tracehelper.relative("/work/repro.py") == "repro.py"
    assert [tracehelper.function_at(str(module), n) for n in (2, 4, 5, 6)] == [
        "outer", "inner", "inner", "outer"
    ]  # fmt: skip
    assert tracehelper.from_script([["<frozen runpy>", 88, "_run_code"], ["repro.py", 3, "m"],
                                    ["pkg/mod.py", 5, "inner"]], "/w/repro.py") == [
        ["repro.py", 3, "m"], ["pkg/mod.py", 5, "inner"]
    ]  # fmt: skip


def test_step_markers_pass_through_and_take_a_snapshot_each() -> None:
    out = io.StringIO()
    snapshots = tracehelper.Snapshots(tracehelper.__file__)
    taken: list[int | None] = []
    snapshots.take = lambda step, force=False: taken.append(step)  # type: ignore[method-assign]
    wrapped = tracehelper.MarkerStdout(out, snapshots)  # type: ignore[arg-type]
    print("::leakbisect-step::", file=wrapped)
    print("loss 0.3\n::leakbisect-step:: 7", file=wrapped)
    wrapped.write("::leakbisect-step:: not-a-number\npartial")
    assert out.getvalue() == (
        "::leakbisect-step::\nloss 0.3\n::leakbisect-step:: 7\n"
        "::leakbisect-step:: not-a-number\npartial"
    )
    assert taken == [None, 7, None] and snapshots.steps_seen == 3


def test_the_helper_runs_a_script_as_python_would_and_writes_its_profile(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(
        "import sys\nkept = []\n"
        "def grow():\n    kept.append(bytearray(512 * 1024))\n"
        "for _ in range(12):\n    grow()\n    print('::leakbisect-step::', flush=True)\n"
        "sys.exit(3)\n"
    )
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, tracehelper.__file__, "tracemalloc", str(out), str(script)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "::leakbisect-step::\n" * 12
    written = json.loads(out.read_text())
    assert (written["tracer"], written["error"]) == ("tracemalloc", None)
    top = written["stacks"][0]
    assert top["frames"] == [["repro.py", 6, "<module>"], ["repro.py", 4, "grow"]]
    assert top["sizes"][-1] >= 12 * 512 * 1024
    assert len(top["sizes"]) == len(written["snapshots"]) >= 2
