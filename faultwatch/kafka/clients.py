"""The one place aiokafka clients are built: every producer, consumer and admin client of
faultwatch gets the process's Kafka security settings (SSL, SASL) here.

The functions take aiokafka's own keyword arguments (`bootstrap_servers=...`), so they stand
in for the classes wherever a factory is injected (tests pass a fake with the same
signature). aiokafka is imported when a client is built: the node side imports this module
without paying for it. A guard test fails when a module outside faultwatch.kafka constructs
an aiokafka client itself."""

from __future__ import annotations

from typing import Any

from faultwatch.kafka import settings
from faultwatch.kafka.settings import KafkaSecurity


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
