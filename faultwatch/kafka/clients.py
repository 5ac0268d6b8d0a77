"""The one place aiokafka clients are built: every producer, consumer and admin client of
faultwatch gets the process's Kafka security settings (SSL, SASL) here.

The functions take aiokafka's own keyword arguments (`bootstrap_servers=...`), so they stand
in for the classes wherever a factory is injected (tests pass a fake with the same
signature). aiokafka is imported when a client is built: the node side imports this module
without paying for it. A guard test fails when a module outside faultwatch.kafka constructs
an aiokafka client itself."""

from __future__ import annotations

import ipaddress
import logging
import sys
from typing import Any

from faultwatch.kafka import settings
from faultwatch.kafka.settings import KafkaSecurity

CLEARTEXT = "Sending username and password in the clear"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def handshake_host() -> str | None:
    """The broker host of the aiokafka connection whose SASL handshake is logging now (its
    `_do_sasl_handshake` frame's `self.host`), or None when not called from there."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_do_sasl_handshake":
            host = getattr(frame.f_locals.get("self"), "host", None)
            return host if isinstance(host, str) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


class CleartextWarning(logging.Filter):
    """aiokafka warns "Sending username and password in the clear" at every SASL PLAIN
    handshake over SASL_PLAINTEXT: 8 lines for one `kafka up --secure`, whose broker-only
    listeners are on 127.0.0.1. On loopback nothing leaves the host: the warning is dropped;
    to another host it is kept once per host (it is true there), its repeats dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.warned: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != CLEARTEXT:
            return True
        host = handshake_host()
        if host is None:
            return True
        if _loopback(host) or host in self.warned:
            return False
        self.warned.add(host)
        return True


_AIOKAFKA_CONN = logging.getLogger("aiokafka.conn")
if not any(isinstance(f, CleartextWarning) for f in _AIOKAFKA_CONN.filters):
    _AIOKAFKA_CONN.addFilter(CleartextWarning())


def _secured(kw: dict[str, Any], security: KafkaSecurity | None) -> dict[str, Any]:
    sec = security if security is not None else settings.current()
    return {**kw, **sec.client_kwargs()}


def producer(*, bootstrap_servers: str, security: KafkaSecurity | None = None,
             **kw: Any) -> Any:
    """An AIOKafkaProducer (not started) with the security settings (`security`, else the
    process's: faultwatch.kafka.settings.current())."""
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped,unused-ignore]

    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, **_secured(kw, security))


def consumer(*topics: str, bootstrap_servers: str, security: KafkaSecurity | None = None,
             **kw: Any) -> Any:
    """An AIOKafkaConsumer (not started), subscribed to `topics` if any, with the security
    settings."""
    from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped,unused-ignore]

    return AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap_servers,
                            **_secured(kw, security))


def admin(*, bootstrap_servers: str, security: KafkaSecurity | None = None, **kw: Any) -> Any:
    """An AIOKafkaAdminClient (not started) with the security settings."""
    from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped,unused-ignore]

    return AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **_secured(kw, security))


def faust_settings() -> dict[str, Any]:
    """The security settings as faust.App settings (`broker_credentials`; empty for
    PLAINTEXT): Faust builds its own aiokafka clients from them."""
    return settings.current().faust_settings()
