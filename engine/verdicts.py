"""Verdict names shared by the classifier, the planner, storage and the wire."""

from enum import StrEnum


class Verdict(StrEnum):
    """What one run, or a candidate's runs together, say about memory.

    `skip` is exit status 125 from the script or an environment that cannot be
    built (git bisect's convention); `error` is a crash or an infrastructure
    failure. Neither is ever blamed for a leak.
    """

    LEAK = "leak"
    CLEAN = "clean"
    PLATEAU = "plateau"
    INCONCLUSIVE = "inconclusive"
    SKIP = "skip"
    ERROR = "error"

    @property
    def leaks(self) -> bool:
        return self is Verdict.LEAK

    @property
    def bounded(self) -> bool:
        """Memory stayed bounded: the run counts as not leaking."""
        return self in (Verdict.CLEAN, Verdict.PLATEAU)

    @property
    def decisive(self) -> bool:
        """The run (or candidate) says leak or not-leak; skip, error and inconclusive do not."""
        return self in (Verdict.LEAK, Verdict.CLEAN, Verdict.PLATEAU)


# How the outcome of a mapped range (--all-transitions) without a transition begins: the
# planner words it (status bounds_failed), and the reports lead with it rather than with
# "a bound failed its check", since no bound failed: the map found nothing.
NO_TRANSITION = "no transition"
