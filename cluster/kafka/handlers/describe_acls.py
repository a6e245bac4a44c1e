"""DescribeAcls (key 29, versions 1-3): the controller's ACLs a filter matches, as ``GET /v1/acls`` lists them.

DESCRIBE on CLUSTER (CLUSTER_AUTHORIZATION_FAILED otherwise). The ACLs are
the replicated state this node has applied (every ACL change returns only
after every live node applied it). A filter naming an UNKNOWN (0) code is
INVALID_REQUEST; one naming a resource type or operation txbroker's model
lacks matches nothing. Codes: ``cluster.kafka.acl_codes``.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from kafka.protocol.admin import DescribeAclsRequest, DescribeAclsResponse

from clients.protocol import BrokerError

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ..acl_codes import OPERATION_CODES, PATTERN_CODES, PERMISSION_CODES, RESOURCE_CODES, filter_of
from ..api import KafkaApi, RequestContext, error_code, error_message

__all__ = ["API"]

_Resource = DescribeAclsResponse.DescribeAclsResource
_Acl = _Resource.AclDescription


async def handle(ctx: RequestContext, request: Any) -> Any:
    try:
        ctx.guard.require(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        flt = filter_of(request)
    except BrokerError as exc:
        return DescribeAclsResponse(throttle_time_ms=0, error_code=error_code(exc), error_message=error_message(exc),
                                    resources=[])  # fmt: skip
    bindings = ctx.services.controller.describe_acls(flt) if flt is not None else []
    resources = []
    key = lambda b: (b.resource_type, b.resource_name, b.pattern_type)  # noqa: E731
    for (rtype, name, pattern), group in groupby(bindings, key=key):  # sorted by resource already
        acls = [_Acl(principal=b.principal, host=b.host, operation=OPERATION_CODES[b.operation],
                     permission_type=PERMISSION_CODES[b.permission]) for b in group]  # fmt: skip
        resources.append(_Resource(resource_type=RESOURCE_CODES[rtype], resource_name=name,
                                   pattern_type=PATTERN_CODES[pattern], acls=acls))  # fmt: skip
    return DescribeAclsResponse(throttle_time_ms=0, error_code=0, error_message=None, resources=resources)


API = KafkaApi("DescribeAcls", DescribeAclsRequest, DescribeAclsResponse, 1, 3, handle)
