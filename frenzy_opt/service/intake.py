"""The scheduler's intake of jobs that API worker processes accepted (``frenzy serve --workers N``).

With several API processes in front of one scheduler, the store is the only channel for submissions: a worker
commits the job row (:mod:`frenzy_opt.service.groupcommit`) and answers; the scheduler's :class:`Intake` thread
reads the rows accepted since the last one it saw, in acceptance order (``seq``), and hands them to the loop.
Rows are committed in ``seq`` order, so reading by a high-water mark sees every row exactly once. The loop
skips a row it knows already (recovered at start, or no longer queued: only the scheduler changes a state).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from frenzy_opt.service.faults import is_store_fault
from frenzy_opt.service.records import JobRecord
from frenzy_opt.service.store import Store

log = logging.getLogger(__name__)

INTAKE_POLL_S = 0.01
"""How often the store is read for new rows while none came (a design choice: a tenth of issue 27's target of
100 ms from acknowledgement to start; an idle read is one indexed query)."""
INTAKE_BATCH = 1000
"""The most rows one read takes (a design choice: the loop decides after each batch it is handed)."""


class Intake:
    """Reads new job rows for the loop (module docstring); ``deliver`` is called from its thread."""

    def __init__(self, store: Store, deliver: Callable[[list[JobRecord]], None], *, poll_s: float = INTAKE_POLL_S):
        self.store = store
        self.deliver = deliver
        self.poll_s = poll_s
        self.mark = 0
        """The ``seq`` of the last row read."""
        self.rows = 0
        """Rows read so far."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, mark: int) -> None:
        """Read the rows after ``mark`` from now on."""
        self.mark = mark
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="frenzy-intake", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def poll(self) -> int:
        """One read: the rows accepted since the mark, handed over; how many."""
        records = self.store.new_since(self.mark, INTAKE_BATCH)
        if records:
            self.mark = records[-1].seq
            self.rows += len(records)
            self.deliver(records)
        return len(records)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                full = self.poll() == INTAKE_BATCH
            except Exception as err:  # the store does not answer: the store's fault says so; read again later
                if not is_store_fault(err):
                    log.exception("intake: reading new jobs failed")
                full = False
            if not full:
                self._stop.wait(self.poll_s)
