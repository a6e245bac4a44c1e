"""raft/fd_limit.py: a node raises its open-files limit as far as it may; the room that leaves for replicas."""

from __future__ import annotations

import resource

import pytest

from raft import fd_limit


class _Limits:
    def __init__(self, soft: int, hard: int, may_raise_hard: bool) -> None:
        self.soft, self.hard, self.may_raise_hard = soft, hard, may_raise_hard

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        soft, hard = limits
        if hard > self.hard and not self.may_raise_hard:
            raise ValueError("not allowed to raise the hard limit")
        if soft > hard:
            raise ValueError("soft above hard")
        self.soft, self.hard = soft, hard


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> _Limits:
    lim = _Limits(1024, 4096, may_raise_hard=False)
    monkeypatch.setattr(fd_limit.resource, "getrlimit", lim.get)
    monkeypatch.setattr(fd_limit.resource, "setrlimit", lim.set)
    monkeypatch.setattr(fd_limit, "_kernel_ceiling", lambda: 1 << 20)
    return lim


def test_an_unprivileged_process_raises_its_soft_limit_to_the_hard_one(limits: _Limits) -> None:
    assert fd_limit.raise_open_files_limit() == 4096
    assert (limits.soft, limits.hard) == (4096, 4096)


def test_a_privileged_process_raises_both_limits_up_to_the_kernel_ceiling(
    limits: _Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits.may_raise_hard = True
    monkeypatch.setattr(fd_limit, "_kernel_ceiling", lambda: 500_000)
    assert fd_limit.raise_open_files_limit() == 500_000
    assert (limits.soft, limits.hard) == (500_000, 500_000)


def test_a_limit_already_high_enough_is_left_alone(limits: _Limits) -> None:
    limits.soft = limits.hard = 2_000_000
    assert fd_limit.raise_open_files_limit() == 2_000_000
    assert (limits.soft, limits.hard) == (2_000_000, 2_000_000)


def test_room_for_replicas_keeps_a_reserve() -> None:
    assert fd_limit.replicas_within(20_000) == (20_000 - 1024) // fd_limit.DESCRIPTORS_PER_REPLICA
    assert fd_limit.replicas_within(512) == 0


def test_the_real_process_limit_only_goes_up() -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        after = fd_limit.raise_open_files_limit()
        assert after >= before[0]
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == after
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)  # lowering is always allowed
