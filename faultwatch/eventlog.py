"""faultwatch's own event lines: one named event per line, key=value fields (`--log-format
text`) or one JSON object (`--log-format json`), each event with a level so that a person's
terminal shows only what needs them (`-q`, `-v`); the escaping that keeps text from jobs
(names, log lines) from forging a line or moving the cursor; and `Quiet`, which counts
repeated events instead of writing a line for each."""

from __future__ import annotations

import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from faultwatch import settings as env_settings

_COMPONENT = "faultwatch"

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
LEVEL_NAMES = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR}
FORMATS = ("text", "json")
FORMAT_ENV = env_settings.LOG_FORMAT.name
LEVEL_ENV = env_settings.LOG_LEVEL.name

# Every event's level. What a person running `faultwatch run`/`agent` must see (something is
# wrong or lost) is a warning; the story of a normal run (started, decided, restarted) is
# info, told by the decision blocks and the closing summary instead; chatter is debug. An
# event missing here is a warning (shown rather than hidden); tests/unit/test_eventlog.py
# checks that every event the code names is listed.
_DEBUG_EVENTS = ("probe", "probe_seen_again", "diagnosis_sent", "restart_backoff",
                 "waiting_for_decision", "spool_writable", "registry_node")
_INFO_EVENTS = (
    # agent and run
    "rules_loaded", "rules_reloaded", "child_started", "child_exit", "decision", "restart",
    "restart_by_exit", "stopping_child", "failed_by_decision", "blacklisted", "verdict",
    "signal", "spool_replay", "node_signing", "decision_signing", "nodes_up",
    "waiting_for_nodes", "bootcheck", "broker_up", "decisions_following",
    "decisions_waiting_for_topic", "waiting_for_topic", "tail_start", "tail_rotated",
    "torchrun_ranks", "metrics_listening", "timeout_chain", "replaced", "spare_waiting",
    "spare_joining", "spare_released",
    # processor
    "processor_starting", "processor_stopping", "processor_stopped", "processor_metrics",
    "partitions_assigned", "partitions_revoked", "registry_following", "registry_loaded",
    "broker_reachable", "job_cap_cleared", "jobs_expired", "fleet_storm_ended",
    "allocation_checking", "incidents_following", "incidents_loaded",
    "holds_loaded", "job_hold",
    # operating services
    "notify_started", "notification_sent", "notify_muted", "actuate_started", "actuate_following",
    "actuated", "actuate_hold_released", "actuate_holding", "actuate_replay",
    "actuate_retry", "actuate_hold_dropped", "actuate_hold_ended", "actuate_dropped",
    "actuate_dropped_summary", "actuate_topic_ready", "alerts_posted", "alert_resolved",
    "alert_status_following")
_WARNING_EVENTS = (
    "broker_down", "broker_refused", "broker_unreachable", "broker_unreachable_summary",
    "faust_slow_processing",
    "decision_refused", "decisions_not_ready", "decisions_out_failed", "decisions_unverified",
    "decisions_unavailable", "escalate", "flush_timeout", "no_decision", "nodes_timeout",
    "pipes_held_open", "produce_failed", "registry_follow_failed", "replay_state_unwritable",
    "rules_rejected", "rules_reload_rejected", "rules_watch_error", "sdk_malformed",
    "sdk_message_too_long", "sdk_unavailable", "send_error", "spawn_failed", "spool_cap",
    "spool_write_drops", "tail_open_failed", "tail_truncated", "undecodable_decision",
    "undecodable_record", "verdict_out_failed", "waiting_for_nodes_unavailable",
    "bootcheck_failed", "bootcheck_abort", "dead_letter", "job_tick_failed", "job_cap_reached",
    "fleet_storm_tripped", "processor_start_retry", "processor_stop_forced",
    "records_refused", "write_unchecked", "hold_undecodable", "holds_full",
    "holds_follow_failed",
    "processor_stop_gave_up", "allocation_unchecked", "actuate_failed", "actuate_gave_up",
    "actuate_refused", "actuate_node_rejected", "actuate_decision_rejected", "actuate_hold",
    "actuate_journal_bad_line", "actuate_waiting_for_topic", "actuate_stop_forced",
    "topic_not_created",
    "notification_failed", "notification_retry",
    "notify_commit_failed", "notify_rate_limited", "metrics_unavailable",
    "metrics_address_file_failed", "alerts_retry", "alerts_failed", "alert_status_unavailable",
    "spare_declined", "spare_status_unavailable", "lemon_node", "incidents_follow_failed",
    "ledger_refused", "ledger_unverified", "run_id_not_shared", "allocation_unavailable",
    "job_evicted", "run_start_refused", "decision_withheld")
_ERROR_EVENTS = ("delivery_crashed", "spool_write_failed", "processor_start_failed",
                 "processor_task_ended")
LEVELS: dict[str, int] = {
    **dict.fromkeys(_DEBUG_EVENTS, DEBUG), **dict.fromkeys(_INFO_EVENTS, INFO),
    **dict.fromkeys(_WARNING_EVENTS, WARNING), **dict.fromkeys(_ERROR_EVENTS, ERROR)}

def level_of(event: str) -> int:
    """The level of an event name (LEVELS; a `<event>_summary` has its event's level)."""
    lv = LEVELS.get(event)
    if lv is not None:
        return lv
    if event.endswith("_summary"):  # Quiet's count of a repeated event
        return level_of(event[:-len("_summary")])
    return WARNING  # names made at run time (`<what>_refused`, `<what>_unverified`) too


class _Config:
    """The process's event-line settings (configure())."""

    fmt: str = env_settings.LOG_FORMAT.raw() or "text"
    fmt = fmt if fmt in FORMATS else "text"
    threshold = LEVEL_NAMES.get((env_settings.LOG_LEVEL.raw() or "").lower(), INFO)


def configure(fmt: str | None = None, level: str | int | None = None) -> None:
    """Set the format (`text` or `json`) and the lowest level written (a name or number)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"log format must be one of {', '.join(FORMATS)}: {fmt!r}")
        _Config.fmt = fmt
    if level is not None:
        _Config.threshold = LEVEL_NAMES[level] if isinstance(level, str) else int(level)


def settings() -> tuple[str, int]:
    """(format, threshold) in force."""
    return _Config.fmt, _Config.threshold


def enabled(event: str) -> bool:
    """Whether an event of this name is written at the current threshold."""
    return level_of(event) >= _Config.threshold


def clean(value: object, keep_tab: bool = False) -> str:
    """value as one line of terminal text: control, format and line-break characters are
    shown escaped (\\n, \\x1b, \\u2028), so a name or a line cannot forge another line or
    move the cursor."""
    s = str(value)
    if s.isprintable() or all(_printable(c, keep_tab) for c in s):
        return s
    return "".join(c if _printable(c, keep_tab) else _escape(c) for c in s)


def _printable(c: str, keep_tab: bool) -> bool:
    return (c == "\t" and keep_tab) or (
        c.isprintable() or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp", "Cs"))


def _escape(c: str) -> str:
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if c in named:
        return named[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def set_component(name: str) -> None:
    """Name the process in every event line (agent, process, run)."""
    global _COMPONENT
    _COMPONENT = name


def _fmt(v: Any) -> str:
    """A value as one token: quoted when it has spaces, quotes or `=`; control, format and
    line-break characters always escaped (a value can never start a forged event line)."""
    s = str(v)
    if not s:
        return '""'
    if s.isprintable() and not any(c in s for c in ' "=\\'):
        return s
    return '"' + clean(s.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def format_event(event: str, fields: dict[str, Any], ts: float | None = None,
                 component: str | None = None) -> str:
    """`ts=... component=... event=... k=v ...` (values with spaces or quotes are quoted)."""
    t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts if ts is not None else time.time()))
    parts = [f"ts={t}Z", f"component={component or _COMPONENT}", f"event={event}"]
    parts += [f"{k}={_fmt(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


def format_json(event: str, fields: dict[str, Any], ts: float | None = None,
                component: str | None = None) -> str:
    """The same event as one JSON object: ts, level, component, event, then the fields (None
    fields left out, as in text); values JSON cannot hold are written as strings."""
    import orjson

    t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts if ts is not None else time.time()))
    obj: dict[str, Any] = {"ts": t + "Z", "level": _level_name(level_of(event)),
                           "component": component or _COMPONENT, "event": event}
    for k, v in fields.items():
        if v is not None and k not in obj:
            obj[k] = v
    return orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def _level_name(level: int) -> str:
    for name, lv in LEVEL_NAMES.items():
        if lv >= level:
            return name
    return "error"


def render_event(event: str, fields: dict[str, Any], component: str | None = None
                 ) -> str | None:
    """The event's line in the configured format, or None when its level is below the
    threshold."""
    if level_of(event) < _Config.threshold:
        return None
    if _Config.fmt == "json":
        return format_json(event, fields, component=component)
    return format_event(event, fields, component=component)


def log_event(event: str, stream: TextIO | None = None, **fields: Any) -> None:
    """Write one event line to stderr (never raises: our logs must not hurt the job)."""
    line = render_event(event, fields)
    if line is None:
        return
    try:
        print(line, file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Quiet:
    """Repeated events, counted: the first of each kind in full, then one summary line per
    interval.

    A process that writes into a training job's stderr (the agent) must not write a line per
    refused record: 5,000 forged decisions were 5,000 `decision_refused` lines (1 MB). `Quiet`
    wraps a log callable; events named in `events` are logged in full the first time for each
    `(event, reason)`, then counted, and `<event>_summary count=N by=reason:count,...` is logged
    at most once per `interval_s` (on the next such event, or on `flush()`). Other events pass.
    """

    def __init__(self, log: Callable[..., None], events: Iterable[str],
                 interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._log, self.events, self.interval_s, self._clock = log, set(events), interval_s, \
            clock
        self._first: set[tuple[str, str]] = set()
        self._counts: dict[str, Counter[str]] = {}
        self._last_summary: dict[str, float] = {}
        self.total: Counter[str] = Counter()

    def __call__(self, event: str, **fields: Any) -> None:
        if event not in self.events:
            self._log(event, **fields)
            return
        reason = str(fields.get("reason", ""))
        self.total[event] += 1
        now = self._clock()
        if (event, reason) not in self._first:
            self._first.add((event, reason))
            self._last_summary.setdefault(event, now)
            self._log(event, **fields, repeats=f"counted, one {event}_summary line per "
                                                f"{self.interval_s:.0f} s")
            return
        self._counts.setdefault(event, Counter())[reason or "-"] += 1
        if now - self._last_summary.get(event, now) >= self.interval_s:
            self._summary(event, now)

    def _summary(self, event: str, now: float) -> None:
        c = self._counts.pop(event, None)
        self._last_summary[event] = now
        if c:
            self._log(f"{event}_summary", count=sum(c.values()), total=self.total[event],
                      by=",".join(f"{k}:{v}" for k, v in c.most_common(8)),
                      interval_s=self.interval_s)

    def tick(self) -> None:
        """Log the counts whose interval has passed (a caller's timer: the summary of a
        flood that stopped is not held back until the next such event)."""
        if not self._counts:
            return
        now = self._clock()
        for event in list(self._counts):
            if now - self._last_summary.get(event, now) >= self.interval_s:
                self._summary(event, now)

    def flush(self) -> None:
        """Log what is counted and not yet summarised (at exit)."""
        now = self._clock()
        for event in list(self._counts):
            self._summary(event, now)
