"""The one broker-error translator: an aiokafka (or socket, or timeout) failure becomes a
BrokerError (BrokerAuthError when the broker refused us) that says what was being done, at
which bootstrap, and what to check."""

from __future__ import annotations

import asyncio
import ssl

from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from faultwatch.errors import BrokerAuthError, BrokerError
from faultwatch.kafka import settings

# what a Kafka call raises when the broker is unreachable or refuses us
BROKER_ERRORS = (KafkaError, OSError, asyncio.TimeoutError)


def broker_error(exc: BaseException, bootstrap: str, what: str) -> BrokerError:
    """Translate a Kafka failure while doing `what` into a BrokerError that says what to
    check; an authentication or authorization failure is a BrokerAuthError."""
    from aiokafka import errors as ke  # type: ignore[import-untyped,unused-ignore]

    if isinstance(exc, BrokerError):
        return exc
    name = type(exc).__name__
    detail = str(exc)
    if detail.startswith(name):  # aiokafka's KafkaError str() already starts with its name
        detail = detail[len(name):].lstrip(": ")
    sec = settings.current()
    refused: type[BrokerError] = BrokerAuthError
    if isinstance(exc, ke.AuthenticationFailedError | ke.SaslAuthenticationFailed):
        hint = (f"authentication failed ({sec.describe()}): check the user name and "
                f"password ({settings.ENV_PREFIX}USERNAME/PASSWORD) and the SASL mechanism")
    elif isinstance(exc, ssl.SSLError | ke.IllegalSaslStateError
                    | ke.UnsupportedSaslMechanismError):
        hint = (f"the TLS/SASL handshake failed ({sec.describe()}): check the protocol, "
                "mechanism and CA file")
    elif isinstance(exc, ke.TopicAuthorizationFailedError | ke.GroupAuthorizationFailedError
                    | ke.ClusterAuthorizationFailedError):
        hint = f"not authorized ({sec.describe()}): check the Kafka ACLs of this principal"
    elif isinstance(exc, ke.KafkaConnectionError | ke.NoBrokersAvailable | ke.KafkaTimeoutError
                    | OSError | asyncio.TimeoutError):
        hint = f"Kafka is unreachable or refused the connection ({sec.describe()})"
        refused = BrokerError
    else:
        hint = f"Kafka failed the request ({sec.describe()})"
        refused = BrokerError
    return refused(f"{what} at {bootstrap}: {hint} [{name}" + (f": {detail[:300]}]" if detail
                                                                else "]"))


async def diagnose(exc: BaseException, bootstrap: str, what: str,
                   timeout_s: float = 15.0) -> BrokerError:
    """Like broker_error, but find the real cause behind aiokafka's generic "Unable to
    bootstrap" (which hides a refused password or a TLS failure in its log): open one
    connection to each bootstrap server with the current settings and report its error."""
    from aiokafka import errors as ke  # type: ignore[import-untyped,unused-ignore]
    from aiokafka.conn import create_conn  # type: ignore[import-untyped,unused-ignore]

    if not isinstance(exc, ke.KafkaConnectionError):
        return broker_error(exc, bootstrap, what)
    kw = settings.client_kwargs()
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        if not port.isdigit():
            continue
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **kw),
                timeout_s)
        except (ke.KafkaError, ssl.SSLError) as cause:
            return broker_error(cause, bootstrap, what)
        except (OSError, TimeoutError):
            continue
        conn.close()
    return broker_error(exc, bootstrap, what)
