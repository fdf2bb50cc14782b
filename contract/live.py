"""A running trial's memory so far, from its samples: the one definition of what a status
line shows, for `bisect-cli run`'s display (service/cli/display.py `TrialWatch`) and for a
runner's heartbeat (runners/agent.py), which the server shows to `submit --wait`.

Pure (no clock, no I/O) and without numpy: the client's display imports it.

Rules, in code order (`LiveFloors.add`):

1. A floor is the lowest memory of one step, or of one second (of the sample's `t`) while no
   step marker was seen; a step (second) has its floor once the next one begins, so the step
   in progress never gives one.
2. The first marker drops what came before it: the set-up (imports, loading) is never a floor.
3. `floor_first` is the first complete step's (second's) floor, `floor` the latest's: how far
   the floor rose so far.
4. `steps` is how many steps the markers so far span (the highest step seen less the lowest,
   plus one: contract/floors.py `steps_done`, what a finished run's horizon counts), so a
   counter that goes back never makes it negative; 0 before the first marker. `rss` is the
   newest sample's memory.

Each `add` replaces `state` (a frozen `LiveMemory`) in one assignment, so a reader on another
thread (the agent's heartbeat) always sees one sample's whole state, never half of two.
"""

from dataclasses import asdict, dataclass, fields

from contract.wire import Sample


@dataclass(frozen=True)
class LiveMemory:
    """What a status line shows of a running trial's memory (bytes), as a heartbeat sends it
    (`contract.wire.Heartbeat` has the same field names). None: no sample (floor) yet."""

    rss: int | None = None
    steps: int = 0
    floor_first: int | None = None
    floor: int | None = None

    def said(self) -> dict[str, int | None]:
        """The fields by name once a sample came (what a heartbeat sends, what a status line
        draws); none before."""
        return asdict(self) if self.rss is not None else {}


# The names of those fields: a heartbeat's, a `Trial` column's and a status line's alike.
LIVE_FIELDS = tuple(f.name for f in fields(LiveMemory))


class LiveFloors:
    """One running trial's samples, folded into its `LiveMemory` (rules above)."""

    def __init__(self) -> None:
        self.state = LiveMemory()
        self._span: tuple[int, int] | None = None  # the lowest and highest step seen
        # The step being seen (("s", second) before any marker) and its lowest memory so far.
        self._window: tuple[str, int] | None = None
        self._low = 0

    def add(self, sample: Sample) -> None:
        first, floor = self.state.floor_first, self.state.floor
        if sample.step is not None and self._span is None:
            # Rule 2: the first marker; what came before it is set-up, never a floor.
            first, floor, self._window = None, None, None
        key = ("step", sample.step) if sample.step is not None else ("s", int(sample.t))
        if key == self._window:
            self._low = min(self._low, sample.rss)
        else:
            if self._window is not None:  # rule 1: the step (second) before this one is complete
                floor = self._low
                first = floor if first is None else first
            self._window, self._low = key, sample.rss
        if sample.step is not None:  # rule 4
            low, high = self._span or (sample.step, sample.step)
            self._span = (min(low, sample.step), max(high, sample.step))
        steps = 0 if self._span is None else self._span[1] - self._span[0] + 1
        self.state = LiveMemory(rss=sample.rss, steps=steps, floor_first=first, floor=floor)
