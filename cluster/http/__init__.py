"""The node's HTTP API (aiohttp): the application, one module of thin adapters per area, and the
signed node-to-node client (``internal``)."""

from .app import make_app
from .internal import PeerHttpClient
from .services import Readiness, Services

__all__ = ["PeerHttpClient", "Readiness", "Services", "make_app"]
