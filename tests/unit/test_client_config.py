"""``--command-config`` files and the ``acl`` command's flags (pure parsing; no cluster)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from clients.security import AclBinding
from cluster.cli import build_parser
from cluster.client_config import apply_command_config, client_options, load_client_config
from cluster.config import ConfigError
from cluster.security_commands import UsageError, acl_bindings, acl_filters, applies_to, read_password


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_relative_paths_resolve_from_the_files_folder(tmp_path: Path) -> None:
    cfg_file = write(tmp_path / "conf" / "admin.toml", 'bootstrap = ["https://a:1", "https://b:2"]\n'
                     'username = "admin"\npassword = "pw"\nssl_cafile = "certs/ca.pem"\n'
                     'ssl_certfile = "/abs/me.pem"\nsecurity_protocol = "SASL_SSL"\n')  # fmt: skip
    cfg = load_client_config(cfg_file)
    assert cfg.bootstrap == "https://a:1,https://b:2"
    assert cfg.security == {
        "sasl_plain_username": "admin", "sasl_plain_password": "pw",
        "ssl_cafile": str((tmp_path / "conf" / "certs" / "ca.pem").resolve()), "ssl_certfile": "/abs/me.pem",
        "security_protocol": "SASL_SSL",
    }  # fmt: skip
    assert "pw" not in repr(cfg)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("bootstrap = ", "not valid TOML"),
        ('usrname = "a"', "unknown keys usrname"),
        ("password = 3", "password must be a string"),
        ("bootstrap = 3", "bootstrap must be"),
    ],
)
def test_bad_files_are_config_errors(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_client_config(write(tmp_path / "c.toml", text))


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_client_config(tmp_path / "absent.toml")


def test_the_files_bootstrap_replaces_the_flag_and_contradictions_are_caught(tmp_path: Path) -> None:
    ca = write(tmp_path / "ca.pem", "")
    f = write(tmp_path / "c.toml", 'bootstrap = "http://x:1"\nusername = "a"\npassword = "b"\n')
    args = build_parser().parse_args(["topic", "list", "--bootstrap", "http://y:2", "--command-config", str(f)])
    apply_command_config(args)
    assert args.bootstrap == "http://x:1"
    assert client_options(args)["sasl_plain_username"] == "a"
    f2 = write(tmp_path / "d.toml", f'username = "a"\npassword = "b"\nssl_cafile = "{ca.name}"\n')
    args = build_parser().parse_args(["topic", "list", "--command-config", str(f2)])
    with pytest.raises(ConfigError, match="need https://"):
        apply_command_config(args)  # a CA file with the default http:// bootstrap
    args = build_parser().parse_args(["topic", "list"])
    apply_command_config(args)
    assert client_options(args) == {}


def test_every_cluster_command_takes_command_config() -> None:
    parser = build_parser()
    commands = [
        ["topic", "list"], ["topic", "create", "t"], ["topic", "describe", "t"], ["topic", "delete", "t"],
        ["produce", "t"], ["consume", "t"], ["copy", "--from", "a", "--to", "b", "--group", "g",
        "--transactional-id", "x"], ["txn", "list"], ["txn", "describe", "x"], ["txn", "abort", "x"],
        ["txn", "producers", "t", "0"], ["cluster", "status"], ["cluster", "health"], ["acl", "list"],
        ["acl", "add"], ["acl", "remove"], ["user", "list"], ["user", "create", "u"], ["user", "delete", "u"],
        ["whoami"],
    ]  # fmt: skip
    for argv in commands:
        assert parser.parse_args([*argv, "--command-config", "f.toml"]).command_config == "f.toml", argv


def acl_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["acl", *argv])


def test_acl_add_makes_every_combination() -> None:
    args = acl_args("add", "--allow-principal", "User:a", "--allow-principal", "User:b", "--deny-principal",
                    "User:c", "--deny-host", "10.0.0.1", "--operation", "Read", "--operation", "describe",
                    "--topic", "t", "--group", "g", "--resource-pattern-type", "PREFIXED")  # fmt: skip
    bindings = acl_bindings(args)
    assert len(bindings) == 2 * 3 * 2
    assert AclBinding("User:a", "TOPIC", "t", "READ", "ALLOW", "*", "PREFIXED") in bindings
    assert AclBinding("User:c", "GROUP", "g", "DESCRIBE", "DENY", "10.0.0.1", "PREFIXED") in bindings
    default_op = acl_bindings(acl_args("add", "--allow-principal", "User:a", "--cluster"))
    assert default_op == [AclBinding("User:a", "CLUSTER", "kafka-cluster", "ALL")]
    assert acl_bindings(acl_args("add", "--allow-principal", "User:a", "--transactional-id", "tx",
                                 "--operation", "IdempotentWrite"))[0].operation == "IDEMPOTENT_WRITE"  # fmt: skip
    with pytest.raises(UsageError, match="resource"):
        acl_bindings(acl_args("add", "--allow-principal", "User:a"))
    with pytest.raises(UsageError, match="principal"):
        acl_bindings(acl_args("add", "--topic", "t"))
    with pytest.raises(SystemExit):
        acl_args("add", "--allow-principal", "User:a", "--topic", "t", "--operation", "Fly")
    with pytest.raises(SystemExit):
        acl_args("add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "match")


def test_acl_list_and_remove_filters() -> None:
    assert acl_filters(acl_args("list"), need_resource=False) == [{}]
    assert acl_filters(acl_args("list", "--principal", "User:a", "--topic", "t"), need_resource=False) == [
        {"principal": "User:a", "resource_type": "TOPIC", "resource_name": "t"}
    ]
    flt = acl_filters(acl_args("remove", "--topic", "t", "--resource-pattern-type", "literal", "--allow-principal",
                               "User:a", "--operation", "write"), need_resource=True)  # fmt: skip
    assert flt == [{"pattern_type": "LITERAL", "principal": "User:a", "permission": "ALLOW",
                    "resource_type": "TOPIC", "resource_name": "t", "operation": "WRITE"}]  # fmt: skip
    assert acl_filters(acl_args("list", "--topic", "orders", "--resource-pattern-type", "match"),
                       need_resource=False) == [{"resource_type": "TOPIC"}]  # fmt: skip
    with pytest.raises(UsageError):
        acl_filters(acl_args("remove"), need_resource=True)


def test_match_is_literal_name_wildcard_or_prefix() -> None:
    def acl(name: str, pattern: str) -> dict[str, str]:
        return {"resource_type": "TOPIC", "resource_name": name, "pattern_type": pattern}

    assert applies_to(acl("orders", "LITERAL"), "TOPIC", "orders")
    assert applies_to(acl("*", "LITERAL"), "TOPIC", "orders")
    assert applies_to(acl("ord", "PREFIXED"), "TOPIC", "orders")
    assert not applies_to(acl("ord", "LITERAL"), "TOPIC", "orders")
    assert not applies_to(acl("orders", "LITERAL"), "GROUP", "orders")


def test_password_comes_from_stdin_or_a_confirmed_prompt() -> None:
    args = build_parser().parse_args(["user", "create", "bob", "--password-stdin"])
    assert read_password(args, io.StringIO("s3cret\nignored\n")) == "s3cret"
    with pytest.raises(UsageError, match="empty"):
        read_password(args, io.StringIO("\n"))
    args = build_parser().parse_args(["user", "create", "bob"])
    answers = iter(["pw", "pw"])
    assert read_password(args, io.StringIO(), lambda _p: next(answers)) == "pw"
    answers = iter(["pw", "other"])
    with pytest.raises(UsageError, match="differ"):
        read_password(args, io.StringIO(), lambda _p: next(answers))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["user", "create", "bob", "--password", "x"])


def test_verify_takes_command_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verify.command import main as verify_main

    assert verify_main(["--command-config", str(tmp_path / "absent.toml"), "--record", str(tmp_path / "h")]) == 2
    assert "no such file" in capsys.readouterr().err
    no_url = write(tmp_path / "n.toml", 'username = "a"\npassword = "b"\n')
    assert verify_main(["--command-config", str(no_url)]) == 2
    assert "names no bootstrap" in capsys.readouterr().err
    contradiction = write(tmp_path / "c.toml", 'bootstrap = "http://a:1"\nsecurity_protocol = "SSL"\n')
    assert verify_main(["--command-config", str(contradiction)]) == 2
    assert "needs https://" in capsys.readouterr().err
    assert verify_main(["--nemesis", "--command-config", str(contradiction)]) == 2
    assert not (tmp_path / "h").exists()
