"""Calm while the broker is away (the processor, `notify`, `actuate`): their Kafka clients
retry at most once a second (aiokafka's default is every 100 ms, and every failed request of
every client logged an ERROR line: ~3,500 lines and most of a core in 20 s), and their
connection errors become one `broker_unreachable` line when they start, a
`broker_unreachable_summary` line every SUMMARY_S while they go on, and one
`broker_reachable` line when they stop."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from faultwatch.eventlog import log_event

RETRY_BACKOFF_MS = 1000  # aiokafka's retry_backoff_ms for the processor's clients
SUMMARY_S = 60.0  # while errors go on: one summary line this often
POLL_S = 5.0  # how often the shell calls poll()
QUIET_S = 15.0  # no connection error for this long: the broker is reachable again
# what aiokafka (and Faust about aiokafka) logs once per failed attempt while the broker is down
PATTERNS = ("Unable connect to node", "Unable to update metadata", "Failed fetch messages",
            "Got error produce response", "Group Coordinator Request failed",
            "Unable to request metadata", "Marking the coordinator dead", "NodeNotReadyError",
            "KafkaConnectionError", "Connect call failed", "Heartbeat failed",
            "OffsetCommit failed", "RequestTimedOutError", "Coordinator dead", "Error sending")
# what mode logs when a timer's run outlasts its interval: a hung commit while the broker is
# away (then counted with the errors above), or a busy worker (a worker under load logs it
# every second: then let through at most once per SUMMARY_S, and the broker is not "down")
SLOW_PATTERNS = ("is overlapping (interval=",)  # mode's "Timer <name> is overlapping ..."
# what aiokafka logs at ERROR while a broker answers but has no group coordinator yet: normal
# on a fresh broker (it is creating __consumer_offsets) and while a coordinator moves. Shown
# at INFO for COORDINATOR_GRACE_S after the first one, at its own level after that.
COORDINATOR_PATTERNS = ("CoordinatorNotAvailable", "NotCoordinatorForGroup",
                        "NotCoordinatorError", "CoordinatorLoadInProgress")
COORDINATOR_GRACE_S = 60.0


class BrokerLogGate(logging.Filter):
    """Counts the connection errors it swallows; `poll(now)` turns them into state lines."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.last_error: float = 0.0
        self.count = 0  # swallowed since the last summary
        self.total = 0
        self.last_summary = 0.0
        self.sample = ""
        self.coordinator_since: float | None = None
        self.slow_shown = float("-inf")  # when a SLOW_PATTERNS line was last let through

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is not ours to judge
            return True
        if "event=" in msg:
            return True  # our own event lines pass
        now = time.time()
        if any(p in msg for p in COORDINATOR_PATTERNS):
            if self.coordinator_since is None:
                self.coordinator_since = now
            if now - self.coordinator_since < COORDINATOR_GRACE_S:
                record.levelno, record.levelname = logging.INFO, "INFO"
            return True
        if any(p in msg for p in SLOW_PATTERNS):
            with self._lock:
                if self.down_since is not None:
                    self.count += 1
                    self.total += 1
                    return False
                if now - self.slow_shown < SUMMARY_S:
                    return False
                self.slow_shown = now
            return True
        if not any(p in msg for p in PATTERNS):
            return True
        with self._lock:
            self.count += 1
            self.total += 1
            self.last_error = now
            first = self.down_since is None
            if first:
                self.down_since = self.last_summary = now
                self.sample = msg[:300]
        if first:
            log_event("broker_unreachable", logger=record.name, error=msg[:300])
        return False

    def poll(self, now: float) -> None:
        """Called every few seconds: the summary while down, the line when it is back."""
        with self._lock:
            if self.down_since is None:
                return
            if now - self.last_error >= QUIET_S:
                down_s, errors = round(self.last_error - self.down_since, 1), self.count
                self.down_since, self.count = None, 0
                back = True
            elif now - self.last_summary >= SUMMARY_S:
                down_s, errors = round(now - self.down_since, 1), self.count
                self.count, self.last_summary = 0, now
                back = False
            else:
                return
        if back:
            log_event("broker_reachable", errors_suppressed=errors, down_s=down_s)
        else:
            log_event("broker_unreachable_summary", errors_suppressed=errors, down_s=down_s,
                      sample=self.sample)


GATE = BrokerLogGate()


def install(gate: BrokerLogGate = GATE) -> BrokerLogGate:
    """Put the gate on every aiokafka, Faust and mode logger (filters of a logger do not see
    its children's records, so each one gets it)."""
    import aiokafka  # noqa: F401 - its loggers exist once its modules are imported
    import aiokafka.consumer.fetcher  # noqa: F401
    import aiokafka.consumer.group_coordinator  # noqa: F401
    import aiokafka.producer.sender  # noqa: F401

    names = [n for n in list(logging.Logger.manager.loggerDict)
             if n.split(".")[0] in ("aiokafka", "faust", "mode")]
    for name in ["aiokafka", *names]:
        lg = logging.getLogger(name)
        if gate not in lg.filters:
            lg.addFilter(gate)
    return gate


def client_backoff() -> dict[str, Any]:
    """Keyword arguments for the processor's own aiokafka clients."""
    return {"retry_backoff_ms": RETRY_BACKOFF_MS}
