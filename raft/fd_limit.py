"""The open-files limit of a node process: every Raft group holds descriptors of its own.

A replica keeps its journal open (the file and the descriptor its memory map holds); its
messages travel on the node links, one connection per peer node whatever the number of
groups (``raft.links``). A node with thousands of partition replicas still needs thousands
of descriptors; the usual soft limit of 1,024 (or a container's 20,000)
runs out long before. Like Kafka's and Redpanda's deployment guides ask of the operator,
the node raises its own soft limit to what it is allowed, at start.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)

# Descriptors one replica of a group holds (journal file, its map).
DESCRIPTORS_PER_REPLICA = 2
_NR_OPEN = "/proc/sys/fs/nr_open"
_WANTED = 1 << 20


def _kernel_ceiling() -> int:
    try:
        with open(_NR_OPEN) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _WANTED


def raise_open_files_limit(wanted: int = _WANTED) -> int:
    """Raise this process's soft RLIMIT_NOFILE toward ``wanted``; the soft limit in force afterwards.

    The hard limit is raised too where the process may (root or CAP_SYS_RESOURCE), up to the
    kernel's ``fs.nr_open``; otherwise the soft limit goes up to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, _kernel_ceiling())
    if hard != resource.RLIM_INFINITY and hard < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))
            return target
        except (ValueError, OSError):
            target = hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        logger.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, e)
        return soft
    return target


def replicas_within(limit: int, reserve: int = 1024) -> int:
    """How many group replicas a node can hold under an open-files ``limit`` (``reserve`` kept for the rest)."""
    return max(0, (limit - reserve) // DESCRIPTORS_PER_REPLICA)
