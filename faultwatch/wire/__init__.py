"""Wire contracts: orjson records on faultwatch's topics, validated once when they enter.

One module per topic: `logs` (agent -> matcher: line batches, read lazily), `events`
(lifecycle and notes, the same on the logs and the signals topic), `signals` (matcher -> job
stage: signals, bounded bundles, ticks), `decisions`, `tables` (the compacted status and
nodes topics), `holds` (operators' holds and mutes: imported from there, not re-exported),
`topics` (the one table of topics and groups: names, keys, partitions, configs, codecs, who
reads and writes), `signing` (signed decisions), `deadletter` (undecodable records),
`rules` (pushed rule sets), `incidents` (run ledgers, what actuators did); `_check` holds
the bounds and validators every decoder uses. Each record's size budget lives beside its
codec (decisions.bounded_decision, signals.cap_signal, deadletter).
`from faultwatch.wire import X` gives every public name below."""

from __future__ import annotations

from faultwatch.wire._check import (
    MAX_ATTEMPT,
    MAX_CONTEXT,
    MAX_EXIT_CODE,
    MAX_ID_CHARS,
    MAX_ITEMS,
    MAX_JSON_DEPTH,
    MAX_JSON_ITEMS,
    MAX_LINES,
    MAX_RANK,
    MAX_RECORD_BYTES,
    MAX_RULESET_RECORD_BYTES,
    MAX_SIGNAL,
    MAX_SIGS,
    MAX_STEP,
    MAX_TAIL,
    MAX_TEXT_CHARS,
    MAX_TS,
    MIN_EXIT_CODE,
    SCHEMA_VERSION,
    decode,
    safe_name,
)
from faultwatch.wire.decisions import (
    decision_of,
    decision_to_dict,
    decode_decision,
    encode_decision,
)
from faultwatch.wire.events import (
    encode_exit,
    encode_heartbeat,
    encode_notice,
    encode_run_start,
    exit_of,
    heartbeat_of,
    note_signal,
    notice_of,
    run_start_dict,
    run_start_of,
)
from faultwatch.wire.logs import (
    LineChunk,
    LineRows,
    LinesBatch,
    LogsRecord,
    decode_logs,
    encode_line_chunks,
    encode_lines,
    line_rows,
    lines_batch_of,
    lines_of,
    logs_record_of,
)
from faultwatch.wire.signals import (
    Tick,
    bundle_head_bytes,
    decode_signals,
    encode_bundle,
    encode_bundles,
    encode_signal,
    encode_tick,
    match_of,
    signal_dict,
    signal_of,
    signals_of_record,
)
from faultwatch.wire.tables import (
    WORKER_KEY_PREFIX,
    decode_node,
    decode_status,
    decode_worker,
    encode_node,
    encode_status,
    encode_worker,
    worker_key,
)
from faultwatch.wire.topics import job_key, log_key, node_key

__all__ = [
    "MAX_ATTEMPT", "MAX_CONTEXT", "MAX_EXIT_CODE", "MAX_ID_CHARS", "MAX_ITEMS",
    "MAX_JSON_DEPTH", "MAX_JSON_ITEMS", "MAX_LINES", "MAX_RANK", "MAX_RECORD_BYTES",
    "MAX_RULESET_RECORD_BYTES", "MAX_SIGNAL", "MAX_SIGS", "MAX_STEP", "MAX_TAIL",
    "MAX_TEXT_CHARS", "MAX_TS", "MIN_EXIT_CODE", "SCHEMA_VERSION", "LineChunk", "LineRows",
    "LinesBatch", "LogsRecord", "Tick", "bundle_head_bytes", "decision_of", "decision_to_dict",
    "decode", "decode_decision", "decode_logs", "decode_node", "decode_signals",
    "decode_status", "encode_bundle", "encode_bundles", "encode_decision", "encode_exit",
    "encode_heartbeat", "encode_line_chunks", "encode_lines", "encode_node", "encode_notice",
    "encode_run_start", "encode_signal", "encode_status", "encode_tick", "exit_of",
    "heartbeat_of", "job_key", "line_rows", "lines_batch_of", "lines_of", "log_key",
    "logs_record_of", "match_of", "node_key", "note_signal", "notice_of", "run_start_dict",
    "run_start_of", "safe_name", "signal_dict", "signal_of", "signals_of_record",
    "WORKER_KEY_PREFIX", "decode_worker", "encode_worker", "worker_key",
]
