"""leakbisect's benchmarks: each measurement side by side with the alternative people use.

    uv run python -m bench                     # full run, writes docs/benchmarks.md + docs/bench/
    uv run python -m bench --quick --out DIR   # CI-sized, writes DIR/benchmarks.md + DIR/bench/

One module per measurement (`classifier`, `bisection`, `envs`, `sampler`, `e2e`); each
has `run(cfg) -> dict` returning JSON-serializable results (tables plus the raw numbers
the plots need). `report` turns them into markdown and PNG plots. Nothing here asserts a
wall time: benchmarks report, tests only check that the harness still runs.
"""
