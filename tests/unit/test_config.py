"""cluster.config: a node's TOML file, parsed and checked."""

from __future__ import annotations

import dataclasses
import pathlib
import tomllib

import pytest

from cluster.config import ConfigError, make_cluster_configs, parse_config, render_config


def _raw(tmp_path: pathlib.Path) -> dict[str, object]:
    cfg = make_cluster_configs(3, tmp_path, http_ports=[9001, 9002, 9003], raft_ports=[9101, 9102, 9103])[0]
    return tomllib.loads(render_config(cfg))


def test_a_rendered_config_parses_back_with_the_defaults(tmp_path: pathlib.Path) -> None:
    cfg = parse_config(_raw(tmp_path), tmp_path)
    assert (cfg.node_id, cfg.http_port, len(cfg.nodes)) == (1, 9001, 3)
    assert cfg.store_direct_io is True


def test_a_switch_takes_only_true_or_false(tmp_path: pathlib.Path) -> None:
    raw = _raw(tmp_path)
    assert parse_config({**raw, "store_direct_io": False}, tmp_path).store_direct_io is False
    with pytest.raises(ConfigError, match="store_direct_io must be true or false"):
        parse_config({**raw, "store_direct_io": "no"}, tmp_path)  # a truthy string must not mean "on"


def test_unknown_keys_are_kept_aside(tmp_path: pathlib.Path) -> None:
    cfg = parse_config({**_raw(tmp_path), "future_knob": 3}, tmp_path)
    assert cfg.extra == {"future_knob": 3}


def test_settings_off_their_defaults_are_rendered(tmp_path: pathlib.Path) -> None:
    cfg = make_cluster_configs(3, tmp_path)[1]
    tuned = dataclasses.replace(cfg, store_direct_io=False, raft_log_compaction_min_entries=5000, log_level="DEBUG")
    back = parse_config(tomllib.loads(render_config(tuned)), tmp_path)
    assert (back.store_direct_io, back.raft_log_compaction_min_entries, back.log_level) == (False, 5000, "DEBUG")
    assert "store_direct_io" not in render_config(cfg)  # defaults stay implicit


def test_each_node_gets_its_own_host_when_hosts_are_given(tmp_path: pathlib.Path) -> None:
    hosts = ["10.9.8.11", "10.9.8.12", "10.9.8.13"]
    configs = make_cluster_configs(3, tmp_path, hosts=hosts, http_ports=[9001] * 3, raft_ports=[9101] * 3)
    assert [c.host for c in configs] == hosts
    assert [n.url for n in configs[0].nodes] == [f"http://{h}:9001" for h in hosts]
    back = parse_config(tomllib.loads(render_config(configs[2])), tmp_path)
    assert (back.host, back.node(1).host if back.node(1) else None) == ("10.9.8.13", "10.9.8.11")
    with pytest.raises(ConfigError, match="hosts lists 2 addresses for 3 nodes"):
        make_cluster_configs(3, tmp_path, hosts=hosts[:2])
