"""Read and create ACLs on a live broker through Kafka's admin API (DescribeAcls, CreateAcls).

aiokafka's admin client has no ACL methods, but it ships the protocol structs; this module
is the one place that sends them (through the client's private `_client`), so an aiokafka
change breaks here and in tests/integration/test_kafka_acls.py, nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from faultwatch.errors import BrokerError
from faultwatch.kafka import acls
from faultwatch.kafka.errors import broker_error
from faultwatch.kafka.settings import KafkaSecurity

_ANY = 1  # the ANY value of the resource, pattern, operation and permission filters


@dataclass(frozen=True)
class ApplyResult:
    """What `apply` did: ACLs created, already present, and extra ones (not ours) found."""

    created: list[acls.Acl]
    present: list[acls.Acl]
    extra: list[acls.Acl]


def _raise_for(code: int, message: str | None, bootstrap: str, what: str) -> None:
    if code == 0:
        return
    from aiokafka.errors import for_code

    exc = for_code(code)(message or "")
    raise broker_error(exc, bootstrap, what)


async def _send(admin: Any, request: Any) -> Any:
    client = admin._client  # noqa: SLF001 - see the module docstring
    return await client.send(client.get_random_node(), request)


async def describe(admin: Any, bootstrap: str) -> list[acls.Acl]:
    """Every ACL binding on the cluster (needs Describe on the cluster)."""
    from aiokafka.protocol.admin import DescribeAclsRequest

    resp = await _send(admin, DescribeAclsRequest(
        resource_type=_ANY, resource_name=None, resource_pattern_type_filter=_ANY,
        principal=None, host=None, operation=_ANY, permission_type=_ANY))
    _raise_for(resp.error_code, resp.error_message, bootstrap, "listing ACLs")
    out: list[acls.Acl] = []
    for rtype, name, pattern, bindings in resp.resources:
        for principal, host, op, perm in bindings:
            out.append(acls.from_codes(rtype, name, pattern, principal, host, op, perm))
    return sorted(out)


async def create(admin: Any, bootstrap: str, wanted: Sequence[acls.Acl]) -> None:
    """Create each binding (the broker ignores one that exists already)."""
    from aiokafka.protocol.admin import CreateAclsRequest

    for a in wanted:
        rtype, name, pattern, principal, host, op, perm = a.key()
        resp = await _send(admin, CreateAclsRequest(rtype, name, pattern, principal, host, op,
                                                    perm))
        for code, message in resp.creation_responses:
            _raise_for(code, message, bootstrap, f"creating the ACL {a.line()}")


async def open_admin(bootstrap: str, security: KafkaSecurity, timeout_s: float = 30.0) -> Any:
    """A started AIOKafkaAdminClient with `security` (errors translated)."""
    from faultwatch.kafka import clients

    admin = clients.admin(bootstrap_servers=bootstrap, security=security,
                          request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as e:
        with contextlib.suppress(Exception):
            await admin.close()
        if isinstance(e, BrokerError):
            raise
        raise broker_error(e, bootstrap, "connecting for ACLs") from e
    return admin


async def apply(bootstrap: str, security: KafkaSecurity, scope: acls.Scope,
                wanted: Sequence[acls.Acl], timeout_s: float = 30.0) -> ApplyResult:
    """Create the missing bindings of `wanted` (idempotent) and report extra ones that the
    same principals hold beyond it (a widened ACL stays: removing grants is the operator's
    call, `kafka-acls.sh --remove`)."""
    admin = await open_admin(bootstrap, security, timeout_s)
    try:
        found = await describe(admin, bootstrap)
        have = {a.key() for a in found}
        missing = [a for a in wanted if a.key() not in have]
        present = [a for a in wanted if a.key() in have]
        await create(admin, bootstrap, missing)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:  # the authorizer applies new ACLs from the metadata log, soon after
            after = {a.key() for a in await describe(admin, bootstrap)}
            still = [a for a in missing if a.key() not in after]
            if not still:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerError(f"the broker did not keep {len(still)} ACL(s), e.g. "
                                  f"{still[0].line()}")
            await asyncio.sleep(0.2)
        return ApplyResult(missing, present, acls.extra(found, wanted, scope))
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def retry_unauthorized(step: Callable[[], Awaitable[None]], timeout_s: float = 15.0
                             ) -> None:
    """Run `step` (e.g. create topics) again while the broker still refuses it as not
    authorised, for up to `timeout_s`: ACLs just created reach every broker's authorizer
    from the metadata log a moment after CreateAcls answers."""
    from faultwatch.kafka.admin import TOPIC_AUTHORIZATION_FAILED, TopicNotCreated

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await step()
            return
        except TopicNotCreated as e:
            if e.code != TOPIC_AUTHORIZATION_FAILED or \
                    asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.5)
