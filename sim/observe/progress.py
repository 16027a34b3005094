"""A run's progress bar (``kvsim run`` on a terminal): requests done and simulated time.

An observer of the instance's steps that costs a counter per step: it looks at the wall
clock once every ``every`` steps and redraws at most once every ``redraw_s`` seconds, and
draws nothing until the run has taken ``delay_s`` seconds of wall time (short runs stay
silent). Whether to draw at all is the caller's choice (a terminal, no ``--quiet``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

import numpy as np

from sim.instance.instance import Instance
from sim.instance.scheduler import FINISHED, REJECTED

if TYPE_CHECKING:
    from tqdm import tqdm

DELAY_S = 3.0  # runs shorter than this draw nothing
REDRAW_S = 0.25  # at most four redraws a second
CHECK_EVERY = 64  # steps between two looks at the wall clock (a step costs ~10-100 us)


class RunProgress:
    """A progress bar of one run, to use as a context manager around it.

    ``attach`` (an observer factory for :func:`sim.run.simulate`) binds it to the instance;
    leaving the context clears the bar, on success or error.
    """

    def __init__(
        self, stream: TextIO, delay_s: float = DELAY_S, redraw_s: float = REDRAW_S,
        every: int = CHECK_EVERY, clock: Callable[[], float] = time.perf_counter,
    ):  # fmt: skip
        self.stream, self.delay_s, self.redraw_s, self.every = stream, delay_s, redraw_s, every
        self.clock = clock
        self.instance: Instance | None = None
        self.bar: tqdm | None = None
        self.steps = 0  # since the last look at the clock
        self.start_s = self.next_s = 0.0

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.bar is not None:
            self.bar.close()

    def attach(self, instance: Instance) -> RunProgress:
        """Observe ``instance``'s steps (the wall clock starts now)."""
        self.instance = instance
        self.start_s = self.clock()
        self.next_s = self.start_s + self.delay_s
        return self

    def step_ended(self, row: dict[str, float]) -> None:
        """One step ended (the count is inlined: a step costs an addition and a comparison)."""
        self.steps += 1
        if self.steps >= self.every:
            self.look()

    def steps_ended(self, rows: dict[str, float | np.ndarray], steps: int) -> None:
        """A run of ``steps`` steps ended."""
        self.steps += steps
        if self.steps >= self.every:
            self.look()

    def look(self) -> None:
        """Look at the wall clock (every ``every`` steps); redraw if it is time to."""
        self.steps = 0
        now = self.clock()
        if now >= self.next_s:
            self.next_s = now + self.redraw_s
            self.redraw()

    def redraw(self) -> None:
        """Draw the requests done (finished or rejected) and the simulated time."""
        assert self.instance is not None, "attach the bar to an instance first"
        status = self.instance.scheduler.status
        done = int(np.count_nonzero((status == FINISHED) | (status == REJECTED)))
        postfix = f"simulated {self.instance.env.now:,.1f} s"
        if self.bar is None:
            from tqdm import tqdm  # (loaded when a bar is first drawn)

            self.bar = tqdm(
                total=len(status), initial=done, desc="simulating", unit="req",
                postfix=postfix, file=self.stream, leave=False, dynamic_ncols=True,
            )  # fmt: skip
            self.bar.start_t -= self.clock() - self.start_s  # elapsed: since the run began
        self.bar.n = done
        self.bar.set_postfix_str(postfix)  # redraws
