"""kafka-python's own integration tests, run against a txbroker cluster's Kafka listener.

kafka-python ships its integration tests in its source distribution; they take
an external broker from ``KAFKA_URI`` (and the broker's Kafka version from
``KAFKA_VERSION``). This module fetches the source distribution of the
installed kafka-python (``pip download``, cached under ``.cache/``), runs the
selected tests in a subprocess against the module's cluster, writes which ran
and how they ended to ``test-artifacts/kafka-python-suite.json``, and asserts
that every selected test passed. ``SELECTED`` lists the producer, idempotent,
transactional and consumer-group tests; ``NOT_SELECTED`` says why the others
of those files are left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import kafka
import pytest

from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache"
ARTIFACT = REPO / "test-artifacts" / "kafka-python-suite.json"
#: The Kafka version the suite is told the broker speaks (it picks its skips and its clients' API versions by it).
KAFKA_VERSION = "3.9.0"

SELECTED = [
    "test/integration/test_producer_integration.py",
    "test/integration/test_consumer_integration.py",
]
PRE_CREATED = ("idempotent_test_topic", "transactional_test_topic")
NOT_SELECTED: dict[str, str] = {
    "test/integration/test_consumer_integration.py::test_kafka_version_infer": (
        "expects ApiVersions to match Kafka 3.9's exact ranges; the listener advertises what it serves"
    ),
}

#: What the suite's fixtures import from its (undistributed) test/service.py, for an external broker only.
SERVICE_STAND_IN = """
class ExternalService:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def start(self):
        pass

    def stop(self):
        pass


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("this run uses an external broker (KAFKA_URI)")
"""


def _source_tree() -> Path:
    """kafka-python's source distribution for the installed version (downloaded once, then cached)."""
    version = kafka.__version__
    root = CACHE / f"kafka-python-{version}"
    if (root / "test" / "integration").is_dir():
        return root
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"kafka-python=={version}", "-d", tmp],
            check=True, timeout=300,
        )  # fmt: skip
        (archive,) = Path(tmp).glob("kafka_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tree = Path(tmp) / f"kafka_python-{version}"
        # The distribution leaves out test/__init__.py (without it ``test`` is the standard library's package)
        # and test/service.py, whose broker processes an external broker does not need.
        (tree / "test" / "__init__.py").touch()
        (tree / "test" / "service.py").write_text(SERVICE_STAND_IN)
        tree.rename(root)
    return root


@pytest.fixture(scope="module")
def suite_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Configured as the suite's own broker is (its servers/resources/default/kafka.properties): the tests
    produce to topics they never create (``auto.create.topics.enable``) and ask for 3 s sessions
    (``group.min.session.timeout.ms=1000``; Kafka's default minimum, 6 s, refuses them with
    INVALID_SESSION_TIMEOUT)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("kafka-python-suite"), 3, auto_create_topics_enable=True,
                           group_min_session_timeout_ms=1000)  # fmt: skip
    try:
        cluster.start()
        # Two tests send to these fixed names and wait 1 s for the first answer, less than a topic's creation and
        # election can take on a loaded machine: made beforehand, with the defaults auto-creation uses.
        for name in PRE_CREATED:
            cluster.create_topic(name, partitions=1, rf=3)
            cluster.wait_leaders(name, 1)
        yield cluster
    finally:
        cluster.close()


def test_kafka_python_integration_suite_passes_against_the_kafka_listener(
    suite_cluster: LocalCluster, tmp_path: Path
) -> None:
    src = _source_tree()
    report = tmp_path / "junit.xml"
    first = suite_cluster.bootstrap_servers.split(",")[0]
    # KAFKA_ROOT: where the suite would find Kafka's scripts; it only checks that the directory exists.
    env = dict(os.environ, KAFKA_URI=f"kafka://{first}", KAFKA_VERSION=KAFKA_VERSION, KAFKA_ROOT=str(tmp_path))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(  # its output is in the failure message
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q",
         "--timeout=120", f"--junitxml={report}", *SELECTED, *(f"--deselect={t}" for t in NOT_SELECTED)],
        cwd=src, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert report.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, why = "passed", None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, why = child.tag, (child.get("message") or "")[:300]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "why": why})
    ARTIFACT.parent.mkdir(exist_ok=True)
    summary = {o: sum(1 for c in cases if c["outcome"] == o) for o in ("passed", "failure", "error", "skipped")}
    record = {"kafka_python": kafka.__version__, "summary": summary, "cases": cases, "not_selected": NOT_SELECTED}
    ARTIFACT.write_text(json.dumps(record, indent=2))
    failed = [c["test"] for c in cases if c["outcome"] in ("failure", "error")]
    assert summary["passed"] > 0, proc.stdout[-3000:]
    assert not failed, f"{failed}\n{proc.stdout[-6000:]}"
