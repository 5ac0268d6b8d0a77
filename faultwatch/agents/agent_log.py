"""The agent's own structured log lines (faultwatch.eventlog format), beside the child's stderr."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from faultwatch.agents.reader import TeeWriter
from faultwatch.eventlog import render_event


class AgentLog:
    """The agent's own messages: one `ts=... component=agent event=... node=...` line each
    (faultwatch.eventlog format), on stderr through the same tee as the child's stderr."""

    def __init__(self, node: str, tee: TeeWriter | None = None, component: str = "agent"):
        self.node = node
        self.tee = tee
        self.component = component

    def __call__(self, event: str, **kv: Any) -> None:
        text = render_event(event, {"node": self.node, **kv}, component=self.component)
        if text is None:  # below the --quiet/-v threshold
            return
        line = (text + "\n").encode()
        if self.tee is not None:
            self.tee.write(line)
        else:
            with contextlib.suppress(OSError):
                os.write(2, line)
