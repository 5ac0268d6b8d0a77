"""Before an operator's write (`rules push|rollback`, `nodes quarantine|release`, `jobs
hold|mute|release`): read the trust policy the live processor workers announce and refuse,
with exit 8, a record they would refuse (trust/announce.py). A write no live worker speaks
for is made with a warning: the processors that start later check it themselves."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from faultwatch.core.status import STALE_S
from faultwatch.errors import BrokerError, RefusedError
from faultwatch.eventlog import log_event
from faultwatch.trust.announce import WHAT, WriteCheck, check_write

READ_TIMEOUT_S = 30.0


def check_operator_write(bootstrap: str, status_topic: str, purpose: str, key: Any,
                         action: str) -> WriteCheck | None:
    """Raise RefusedError when a live worker would refuse a `purpose` record signed by `key`
    (a trust.keys.SigningKey, or None: unsigned); the check made, or None when the workers'
    records could not be read (logged: the write goes ahead unchecked)."""
    from faultwatch.kafka.errors import BROKER_ERRORS
    from faultwatch.rollout.rules_status import read_live_workers

    key_id = None if key is None else key.key_id
    try:
        workers = asyncio.run(asyncio.wait_for(
            read_live_workers(bootstrap, status_topic, time.time()), READ_TIMEOUT_S))
    except (BrokerError, *BROKER_ERRORS) as e:  # a principal that may write, not read it
        log_event("write_unchecked", what=WHAT[purpose], topic=status_topic,
                  error=str(e)[:300], note="the processors' trust policy could not be read")
        return None
    check = check_write(purpose, key_id, workers)
    if check.refused:
        raise RefusedError(f"{action} refused: {check.message(key_id)}")
    if not workers:
        log_event("write_unchecked", what=WHAT[purpose], topic=status_topic,
                  note=f"no processor worker announced its trust policy in the last "
                       f"{STALE_S:g} s (none running?); those that start will check it")
    elif check.silent:
        log_event("write_unchecked", what=WHAT[purpose], workers=",".join(check.silent[:5]),
                  note="these workers announce no trust policy (an older version)")
    return check
