"""What one Kafka API handler is, and what it is handed for a request.

A handler module (``cluster/kafka/handlers/<api>.py``) declares one
``KafkaApi``: the kafka-python request and response message classes (generated
from Kafka's JSON schemas), the versions it serves and an ``async`` function
from the decoded request to the response's fields. The server decodes the
frame, checks the version, calls the function and encodes its answer in the
request's version; ApiVersions is built from the registered handlers, so a
version is advertised exactly when a handler serves it.

The function calls the node's domain services (``Services``: the same
partitions, transaction coordinator and group coordinator the HTTP routes
use) and authorizes through the connection's ``Guard``, whose principal is
what SASL authenticated (``User:ANONYMOUS`` on a listener without security).
Errors come back per partition or per resource as Kafka's numeric codes:
``error_code(exc)`` maps a ``BrokerError`` to the code a Kafka client knows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clients.protocol import BrokerError, ErrorCode

from ..http.services import Services
from ..security.guard import Guard

__all__ = ["Connection", "ControllerCaller", "KafkaApi", "RequestContext", "error_code", "error_message"]

#: txbroker's own error names that have no Kafka code of their own, as the nearest code a Kafka client knows.
_KAFKA_CODE: dict[ErrorCode, ErrorCode] = {
    ErrorCode.RECORD_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.TRANSACTION_RESERVATION_REVOKED: ErrorCode.INVALID_TXN_STATE,
}


def error_code(exc: BaseException | ErrorCode | None) -> int:
    """The Kafka error code of ``exc`` (0 for None; UNKNOWN_SERVER_ERROR for anything that is not a BrokerError)."""
    if exc is None:
        return 0
    code = exc if isinstance(exc, ErrorCode) else exc.error_code if isinstance(exc, BrokerError) else None
    if code is None:
        return ErrorCode.UNKNOWN_SERVER_ERROR.code
    return _KAFKA_CODE.get(code, code).code


def error_message(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    return exc.message if isinstance(exc, BrokerError) else "internal error"


@dataclass
class Connection:
    """One client connection's state: who it is (after SASL) and where it comes from."""

    peer_host: str
    tls: bool
    guard: Guard
    #: SASL: the mechanism chosen by SaslHandshake, and whether the connection still has to authenticate
    sasl_mechanism: str | None = None
    authenticated: bool = True
    #: per-connection state of a multi-step exchange (SCRAM's server nonce and first message)
    sasl_state: dict[str, Any] = field(default_factory=dict)
    #: SaslHandshake v0 chose the mechanism: the next frames are raw SASL tokens until authenticated
    sasl_raw_tokens: bool = False
    #: who the connection authenticated as (None: ``User:ANONYMOUS`` on an open listener)
    principal: str | None = None
    #: set by a handler whose answer is the connection's last (a failed authentication): the server closes it then
    close_after_response: bool = False


class ControllerCaller(Protocol):
    """How a controller command reaches the controller leader (``cluster.kafka.controller_calls``)."""

    async def call(self, refused: BrokerError, method: str, path: str, body: Any, principal: str, host: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class RequestContext:
    services: Services
    connection: Connection
    api_version: int
    client_id: str | None
    correlation_id: int
    #: how a controller command reaches the controller leader from a node that does not lead it (None: it does not)
    controller_calls: ControllerCaller | None = None

    @property
    def guard(self) -> Guard:
        return self.connection.guard

    @property
    def node_id(self) -> int:
        return self.services.config.node_id


#: ``handle(ctx, request) -> response fields`` (a dict of the response's top-level fields, or a message object)
HandleFn = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class KafkaApi:
    """One Kafka API: its message classes, the versions served and the handler.

    ``request``/``response``: kafka-python message classes (``kafka.protocol``). The versions
    ``min_version..max_version`` are advertised in ApiVersions and decoded; a handler may still refuse
    some of them with an error code (Produce advertises 0, as librdkafka expects, and answers
    UNSUPPORTED_FOR_MESSAGE_FORMAT below version 3). ``authenticated``: False only for the APIs a client
    uses before SASL completes (ApiVersions, SaslHandshake, SaslAuthenticate).
    """

    name: str
    request: Any
    response: Any
    min_version: int
    max_version: int
    handle: HandleFn
    authenticated: bool = True

    @property
    def api_key(self) -> int:
        return int(self.request.API_KEY)

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version
