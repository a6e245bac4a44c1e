"""DeleteAcls (key 31, versions 1-3): ACLs removed from the controller's state, as ``DELETE /v1/acls`` removes them.

ALTER on CLUSTER (each filter's result CLUSTER_AUTHORIZATION_FAILED
otherwise). Each filter is checked alone (INVALID_REQUEST for UNKNOWN codes;
one naming what txbroker's model lacks matches nothing); the valid ones are
applied in one controller command, and each filter's result lists the removed
ACLs it matches. A node that does not lead the controller sends the filters
to the leader (``cluster.kafka.controller_calls``).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteAclsRequest, DeleteAclsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, AclBinding, AclFilter, Operation, ResourceType
from ..acl_codes import OPERATION_CODES, PATTERN_CODES, PERMISSION_CODES, RESOURCE_CODES, filter_of
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..controller_calls import forward

__all__ = ["API"]

_Result = DeleteAclsResponse.DeleteAclsFilterResult
_Matching = _Result.DeleteAclsMatchingAcl


def _matching(b: AclBinding) -> Any:
    return _Matching(error_code=0, error_message=None, resource_type=RESOURCE_CODES[b.resource_type],
                     resource_name=b.resource_name, pattern_type=PATTERN_CODES[b.pattern_type], principal=b.principal,
                     host=b.host, operation=OPERATION_CODES[b.operation],
                     permission_type=PERMISSION_CODES[b.permission])  # fmt: skip


async def _delete(ctx: RequestContext, filters: list[AclFilter]) -> list[AclBinding]:
    try:
        return await ctx.services.controller.delete_acls(filters)
    except BrokerError as exc:
        answer = await forward(ctx, exc, "DELETE", "/v1/acls", {"filters": [f.to_json() for f in filters]})
        return [AclBinding.from_json(item) for item in answer.get("deleted", [])]


async def handle(ctx: RequestContext, request: Any) -> Any:
    if not ctx.guard.allowed(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
        message = f"{ctx.guard.principal} may not alter the cluster's ACLs"
        return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            _Result(error_code=denied, error_message=message, matching_acls=[]) for _ in request.filters])  # fmt: skip
    outcomes: list[BrokerError | AclFilter | None] = []
    for f in request.filters:
        try:
            outcomes.append(filter_of(f))
        except BrokerError as exc:
            outcomes.append(exc)
    valid = [f for f in outcomes if isinstance(f, AclFilter)]
    deleted: list[AclBinding] = []
    failure: BrokerError | None = None
    if valid:
        try:
            deleted = await _delete(ctx, valid)
        except BrokerError as exc:
            failure = exc
    results = []
    for outcome in outcomes:
        err = outcome if isinstance(outcome, BrokerError) else failure
        if err is not None:
            results.append(_Result(error_code=error_code(err), error_message=error_message(err), matching_acls=[]))
            continue
        matched = [_matching(b) for b in deleted if isinstance(outcome, AclFilter) and outcome.matches(b)]
        results.append(_Result(error_code=0, error_message=None, matching_acls=matched))
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)


API = KafkaApi("DeleteAcls", DeleteAclsRequest, DeleteAclsResponse, 1, 3, handle)
