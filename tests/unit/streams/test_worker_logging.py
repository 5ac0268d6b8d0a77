"""The worker's logging: Faust's terminal spinner would set the root logger to DEBUG, so every
debug call of aiokafka and Faust (one per produced record) built a log record."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from faultwatch.core.policy import policy_for
from faultwatch.streams.faust_app import ProcessorConfig, build_processor
from faultwatch.streams.worker import ProcessorWorker
from faultwatch.wire.topics import Topics
from tests.support.rules import builtin_ruleset


def test_the_worker_keeps_the_root_logger_at_its_level(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTWATCH_PROCESSOR_DIR", str(tmp_path))
    rs = builtin_ruleset()
    cfg = ProcessorConfig(bootstrap="127.0.0.1:9", ruleset=rs, policy=policy_for(rs.policy, {}),
                          topics=Topics("unit.worker.logging."))
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, root.handlers[:]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = ProcessorWorker(build_processor(cfg), loglevel="warning", quiet=True)
        worker._setup_logging()  # noqa: SLF001 - what execute_from_commandline does first
        assert root.level == logging.WARNING
        producer_log = logging.getLogger("aiokafka.producer.producer")
        assert not producer_log.isEnabledFor(logging.DEBUG)
        assert producer_log.isEnabledFor(logging.WARNING)  # positive control
    finally:
        root.setLevel(saved_level)
        root.handlers[:] = saved_handlers
        asyncio.set_event_loop(None)
        loop.close()
