"""A webhook receiver and decision records for the notifier's integration tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from faultwatch.kafka import broker as kafka_broker


class Hook:
    """A webhook receiver on a free port: records every POST; fails the first `fail` ones."""

    def __init__(self, fail: int = 0, status: int = 500):
        self.posts: list[tuple[float, int, dict[str, Any]]] = []
        self.fail, self.status = fail, status
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hook.lock:
                    code = hook.status if len(hook.posts) < hook.fail else 200
                    hook.posts.append((time.monotonic(), code, body))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true}')

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((kafka_broker.HOST, kafka_broker.free_port()), Handler)
        self.url = f"http://{kafka_broker.HOST}:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(t, b) for t, c, b in self.posts if c == 200]


def dec(job: str, i: int, kind: str = "error", action: str = "restart") -> dict[str, Any]:
    return {"v": 1, "id": f"{job}/{i}/{action}/{kind}", "job": job, "attempt": i,
            "action": action, "targets": {"nodes": ["n1"], "ranks": []},
            "reason": {"kind": kind, "rule": "nccl.timeout", "category": "retryable",
                       "message": "NCCL watchdog timeout"},
            "evidence": {}, "budgets": {}, "rules_version": "", "ts": time.time()}


async def publish(bootstrap: str, topic: str, decisions: list[dict[str, Any]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for d in decisions:
            await p.send(topic, orjson.dumps(d), key=str(d["job"]).encode())
        await p.flush()
    finally:
        await p.stop()
