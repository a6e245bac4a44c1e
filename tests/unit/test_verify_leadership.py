"""Leader changes after a heal (verify.leadership) and how the report attaches them to fault windows."""

from __future__ import annotations

from verify.availability import compute_availability
from verify.leadership import changed_groups, parse_leadership


def _metrics(terms: dict[str, int], leads: set[str]) -> str:
    lines = ["# TYPE txbroker_raft_term gauge", "# TYPE txbroker_raft_is_leader gauge"]
    for group, term in terms.items():
        topic, partition = group.split("/")
        labels = f'{{topic="{topic}",partition="{partition}"}}'
        lines.append(f"txbroker_raft_term{labels} {term}")
        lines.append(f"txbroker_raft_is_leader{labels} {int(group in leads)}")
    return "\n".join(lines) + "\n"


def test_the_leader_is_the_node_leading_at_the_highest_term() -> None:
    texts = [
        _metrics({"t/0": 4, "__controller/0": 2}, {"t/0"}),  # a stale leader of t/0 at term 4 (just resumed)
        _metrics({"t/0": 5, "__controller/0": 2}, {"t/0", "__controller/0"}),
        None,  # no answer
    ]
    assert parse_leadership(texts) == {"t/0": (1, 5), "__controller/0": (1, 2)}


def test_a_group_nobody_leads_has_no_leader() -> None:
    assert parse_leadership([_metrics({"t/0": 3}, set()), _metrics({"t/0": 3}, set())]) == {"t/0": (-1, 3)}


def test_changed_groups_compares_leader_and_term_of_groups_in_both() -> None:
    before = {"a/0": (0, 3), "b/0": (1, 2), "c/0": (2, 7)}
    after = {"a/0": (0, 3), "b/0": (1, 3), "c/0": (0, 8)}
    assert changed_groups(before, after) == ["b/0", "c/0"]
    assert changed_groups(before, {"a/0": (0, 3)}) == []


def test_windows_carry_the_changes_after_their_heal_and_a_bridge_is_no_single_node_fault() -> None:
    faults = [
        ("start", "kill", [2], 10.0), ("heal", "kill", [2], 18.0),
        ("start", "bridge", [1], 30.0), ("heal", "bridge", [1], 38.0),
    ]  # fmt: skip
    commits = [5.0, 11.0, 12.0, 19.0, 31.0, 37.5, 40.0]
    a = compute_availability(commits, commits, faults, 0.0, 50.0, leadership=[(18.0, 0), (38.0, 2)])
    kill, bridge = a.windows
    assert (kill.leader_changes_after_heal, bridge.leader_changes_after_heal) == (0, 2)
    assert kill.to_json()["leader_changes_after_heal"] == 0
    # The bridge's 6.5 s gap does not count as a single-node fault's; the kill's 6 s does.
    assert bridge.longest_commit_gap == 6.5
    assert a.max_single_node_commit_gap() == 6.0


def test_per_fault_class_median_and_max_over_its_windows() -> None:
    faults = [
        ("start", "kill", [1], 0.0), ("heal", "kill", [1], 10.0),
        ("start", "kill", [2], 20.0), ("heal", "kill", [2], 30.0),
        ("start", "kill", [3], 40.0), ("heal", "kill", [3], 50.0),
        ("start", "pause", [1], 60.0), ("heal", "pause", [1], 70.0),
    ]  # fmt: skip
    # kill windows: commit gaps 2, 4 and 10 (no commit in the third); pause: 1.
    commits = [2.0, 4.0, 6.0, 8.0, 10.5, 24.0, 28.0, 30.2, 51.0, *(float(t) for t in range(61, 70)), 70.5]
    a = compute_availability(commits, commits, faults, 0.0, 80.0, leadership=[(10.0, 0), (30.0, 1), (50.0, 0)])
    kill = a.by_fault()["kill"]
    assert kill["windows"] == 3
    assert kill["longest_commit_gap"] == {"median": 4.0, "max": 10.0}
    assert kill["leader_changes_after_heal"] == {"median": 0, "max": 1}
    assert a.by_fault()["pause"]["longest_commit_gap"] == {"median": 1.0, "max": 1.0}
    assert a.to_json()["by_fault"]["kill"]["commit_recovery"]["max"] == 1.0
