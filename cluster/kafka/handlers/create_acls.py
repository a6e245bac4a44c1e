"""CreateAcls (key 30, versions 1-3): ACLs added to the controller's state, as ``POST /v1/acls`` adds them.

ALTER on CLUSTER (each result CLUSTER_AUTHORIZATION_FAILED otherwise). Each
creation is checked alone (INVALID_REQUEST for a principal, host, name or
code that does not fit: ``cluster.kafka.acl_codes``); the valid ones are
added in one controller command, which returns once every live node applied
it, so they hold everywhere when the answer comes. A node that does not lead
the controller sends them to the leader (``cluster.kafka.controller_calls``).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import CreateAclsRequest, CreateAclsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, AclBinding, Operation, ResourceType
from ..acl_codes import binding_of
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..controller_calls import forward

__all__ = ["API"]

_Result = CreateAclsResponse.AclCreationResult


async def handle(ctx: RequestContext, request: Any) -> Any:
    if not ctx.guard.allowed(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
        message = f"{ctx.guard.principal} may not alter the cluster's ACLs"
        results = [_Result(error_code=denied, error_message=message) for _ in request.creations]
        return CreateAclsResponse(throttle_time_ms=0, results=results)
    outcomes: list[BrokerError | AclBinding] = []
    for creation in request.creations:
        try:
            outcomes.append(binding_of(creation))
        except BrokerError as exc:
            outcomes.append(exc)
    valid = [b for b in outcomes if isinstance(b, AclBinding)]
    failure: BrokerError | None = None
    if valid:
        try:
            try:
                await ctx.services.controller.create_acls(valid)
            except BrokerError as exc:
                await forward(ctx, exc, "POST", "/v1/acls", {"acls": [b.to_json() for b in valid]})
        except BrokerError as exc:
            failure = exc
    results = []
    for outcome in outcomes:
        err = outcome if isinstance(outcome, BrokerError) else failure
        results.append(_Result(error_code=error_code(err), error_message=error_message(err)))
    return CreateAclsResponse(throttle_time_ms=0, results=results)


API = KafkaApi("CreateAcls", CreateAclsRequest, CreateAclsResponse, 1, 3, handle)
