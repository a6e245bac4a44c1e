"""The Kafka listener: Kafka's binary protocol on each node's ``kafka_port`` (API.md "Kafka listener")."""

from .server import KafkaServer

__all__ = ["KafkaServer"]
