"""Admin client: topics and cluster metadata (kafka-python's KafkaAdminClient, over HTTP)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ._http import request_json


class Admin:
    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 30000) -> None:
        self._url = bootstrap.rstrip("/")
        self._timeout = request_timeout_ms / 1000

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return request_json(method, self._url + path, body, timeout=self._timeout)

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "partitions": partitions, "replication_factor": replication_factor}
        if config:
            body["config"] = config
        result: dict[str, Any] = self._call("POST", "/v1/topics", body)
        return result

    def delete_topic(self, name: str) -> None:
        self._call("DELETE", f"/v1/topics/{quote(name, safe='')}")

    def list_topics(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/topics")["topics"]
        return result

    def describe_topic(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/topics/{quote(name, safe='')}")
        return result

    def describe_cluster(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/cluster")
        return result

    def metadata(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/metadata")
        return result

    def close(self) -> None:
        """Nothing to release (one connection per call); here for kafka-python parity."""
