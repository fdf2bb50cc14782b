"""What the service and the runners share, and all they share: the wire models of a trial
(`wire`), the one exception hierarchy (`errors`), the judged part of a run (`floors`) and the
early-stop rules both apply (`earlystop`), a running trial's status line so far (`live`), the
downsampling of a series (`series`). It imports
neither side (pyproject.toml's import-linter contracts), so a runner installs without the
service's storage and the service never reaches into a runner's internals.
"""
