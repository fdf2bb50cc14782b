"""The pure engine: what to run next (`planner`), how a run is judged (`analysis`, `pooled`,
`crash`, `verdicts`), which changes leak together (`ddmin`), which stacks grow (`attribution`),
ranges and pins (`releases`, `resolution`, `baseenv`), the findings as text (`findings`), units,
and traces with known truth (`synthetic`). No I/O, no database, no clock but what it is given:
it imports only `contract` (pyproject.toml's import-linter contracts).
"""
