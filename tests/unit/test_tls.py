"""TLS contexts and generated certificates: real handshakes in memory (``ssl.MemoryBIO``), no sockets."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster.config import ConfigError, SecurityConfig
from cluster.security.certs import (
    certificate_covers,
    make_ca,
    make_client_certificate,
    make_node_certificate,
)
from cluster.security.tls import client_context, node_client_context, peer_principal, server_context


class HandshakeFailed(Exception):
    def __init__(self, side: str, error: ssl.SSLError) -> None:
        super().__init__(f"{side}: {error}")
        self.side = side
        self.error = error


def handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """A complete TLS handshake between the two contexts through memory buffers: (client, server)."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(50):
        for side, obj in (("client", client), ("server", server)):
            if done[side]:
                continue
            try:
                obj.do_handshake()
                done[side] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                raise HandshakeFailed(side, exc) from exc
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server judges the client certificate after the client's handshake is done;
            # one round of application data carries its verdict back.
            client.write(b"ping")
            s_in.write(c_out.read())
            try:
                assert server.read(4) == b"ping"
            except ssl.SSLError as exc:
                raise HandshakeFailed("server", exc) from exc
            return client, server
    raise AssertionError("handshake did not finish")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca_cert, ca_key = make_ca(tmp_path / "certs", "test CA")
    node_cert, node_key = make_node_certificate(ca_cert, ca_key, tmp_path / "certs", 1, "127.0.0.1")
    return {"dir": tmp_path / "certs", "ca": ca_cert, "ca_key": ca_key, "cert": node_cert, "key": node_key}


def node_security(pki: dict[str, Path], client_auth: str = "none") -> SecurityConfig:
    return SecurityConfig(
        tls_cert_file=pki["cert"], tls_key_file=pki["key"], tls_ca_file=pki["ca"], tls_client_auth=client_auth,
        authentication=("mtls",) if client_auth == "required" else ("basic",),
    )  # fmt: skip


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# ---- certificates ------------------------------------------------------------------------------


def test_ca_is_a_ten_year_signing_ca_and_keys_are_private(pki: dict[str, Path]) -> None:
    ca = load(pki["ca"])
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    years = (ca.not_valid_after_utc - ca.not_valid_before_utc).days / 365
    assert 9.9 < years < 10.1
    for name in ("ca.key", "node-1.key"):
        assert (pki["dir"] / name).stat().st_mode & 0o777 == 0o600
    assert pki["ca"].stat().st_mode & 0o077 != 0o077  # a certificate is public; only keys are 0600


def test_node_certificate_names_node_and_serves_both_ways(pki: dict[str, Path]) -> None:
    cert = load(pki["cert"])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "txbroker-node-1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(load(pki["ca"]))


def _sans(path: Path) -> tuple[set[str], set[str]]:
    san = load(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}, set(san.get_values_for_type(x509.DNSName))


@pytest.mark.parametrize(
    ("host", "ips", "dns"),
    [
        ("127.0.0.1", {"127.0.0.1"}, {"localhost"}),
        ("localhost", {"127.0.0.1"}, {"localhost"}),
        ("10.1.2.3", {"10.1.2.3"}, set()),
        ("fd00::7", {"fd00::7"}, set()),
        ("broker-2.example.com", set(), {"broker-2.example.com"}),
    ],
)
def test_node_certificate_san_is_the_host(pki: dict[str, Path], host: str, ips: set[str], dns: set[str]) -> None:
    cert, _ = make_node_certificate(pki["ca"], pki["ca_key"], pki["dir"], 7, host)
    assert _sans(cert) == (ips, dns)
    assert certificate_covers(cert, pki["ca"], host)
    assert not certificate_covers(cert, pki["ca"], "10.9.9.9")
    assert ipaddress.ip_address("10.9.9.9")  # a host the certificate does not name


def test_certificate_covers_checks_the_issuer(pki: dict[str, Path], tmp_path: Path) -> None:
    other_ca, _ = make_ca(tmp_path / "other", "other CA")
    assert certificate_covers(pki["cert"], pki["ca"], "127.0.0.1")
    assert not certificate_covers(pki["cert"], other_ca, "127.0.0.1")
    assert not certificate_covers(tmp_path / "missing.pem", pki["ca"], "127.0.0.1")


# ---- handshakes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_client_trusting_the_ca_verifies_the_node(pki: dict[str, Path], name: str) -> None:
    client, server = handshake(server_context(node_security(pki)), client_context(pki["ca"]), name)
    assert client.version() in ("TLSv1.2", "TLSv1.3")
    assert client.compression() is None
    assert peer_principal(server) is None  # no client certificate asked for


def test_a_name_outside_the_san_fails_hostname_verification(pki: dict[str, Path]) -> None:
    with pytest.raises(HandshakeFailed) as err:
        handshake(server_context(node_security(pki)), client_context(pki["ca"]), "broker.example.com")
    assert err.value.side == "client"
    assert isinstance(err.value.error, ssl.SSLCertVerificationError)


def test_client_not_trusting_the_ca_fails(pki: dict[str, Path], tmp_path: Path) -> None:
    other_ca, _ = make_ca(tmp_path / "other", "other CA")
    for ctx in (client_context(other_ca), client_context()):  # another CA; the system CAs
        with pytest.raises(HandshakeFailed) as err:
            handshake(server_context(node_security(pki)), ctx, "127.0.0.1")
        assert err.value.side == "client"
        assert isinstance(err.value.error, ssl.SSLCertVerificationError)


def test_server_context_refuses_old_protocols(pki: dict[str, Path]) -> None:
    ctx = server_context(node_security(pki))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.options & ssl.OP_NO_COMPRESSION
    assert ctx.verify_mode == ssl.CERT_NONE


def test_node_client_context_presents_the_node_certificate(pki: dict[str, Path]) -> None:
    sec = node_security(pki, "required")
    ctx = node_client_context(sec)
    assert ctx is not None
    _client, server = handshake(server_context(sec), ctx, "127.0.0.1")
    assert peer_principal(server) == "User:txbroker-node-1"
    assert node_client_context(None) is None
    assert node_client_context(SecurityConfig()) is None


def test_mtls_client_certificate_names_the_principal(pki: dict[str, Path]) -> None:
    cert, key = make_client_certificate(pki["ca"], pki["ca_key"], pki["dir"], "alice")
    assert (pki["dir"] / "alice.key").stat().st_mode & 0o777 == 0o600
    _client, server = handshake(server_context(node_security(pki, "required")),
                                client_context(pki["ca"], cert, key), "127.0.0.1")  # fmt: skip
    assert peer_principal(server) == "User:alice"
    peercert = server.getpeercert()
    assert peercert is not None
    assert peer_principal(peercert) == "User:alice"


def test_mtls_refuses_a_client_without_certificate(pki: dict[str, Path]) -> None:
    with pytest.raises(HandshakeFailed) as err:
        handshake(server_context(node_security(pki, "required")), client_context(pki["ca"]), "127.0.0.1")
    assert err.value.side == "server"


def test_mtls_refuses_an_expired_client_certificate(pki: dict[str, Path]) -> None:
    expired_at = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    cert, key = make_client_certificate(pki["ca"], pki["ca_key"], pki["dir"], "mallory", not_after=expired_at)
    assert load(cert).not_valid_after_utc < dt.datetime.now(dt.UTC)
    with pytest.raises(HandshakeFailed) as err:
        handshake(server_context(node_security(pki, "required")), client_context(pki["ca"], cert, key), "127.0.0.1")
    assert err.value.side == "server"
    assert "expired" in str(err.value.error)


def test_mtls_refuses_a_certificate_of_another_ca(pki: dict[str, Path], tmp_path: Path) -> None:
    other_ca, other_key = make_ca(tmp_path / "other", "other CA")
    cert, key = make_client_certificate(other_ca, other_key, tmp_path / "other", "alice")
    with pytest.raises(HandshakeFailed) as err:
        handshake(server_context(node_security(pki, "required")), client_context(pki["ca"], cert, key), "127.0.0.1")
    assert err.value.side == "server"


def test_peer_principal_without_a_verified_certificate() -> None:
    assert peer_principal(None) is None
    assert peer_principal({}) is None  # what getpeercert() gives for a certificate not verified
    assert peer_principal({"subject": ((("organizationName", "x"),),)}) is None
    assert peer_principal({"subject": ((("commonName", "bob"),),)}) == "User:bob"
    assert peer_principal({"subject": ((("commonName", "User:root"),),)}) is None


# ---- bad files -----------------------------------------------------------------------------------


def test_unreadable_or_mismatched_files_are_config_errors(pki: dict[str, Path], tmp_path: Path) -> None:
    other_cert, other_key = make_node_certificate(pki["ca"], pki["ca_key"], tmp_path / "other", 2, "127.0.0.1")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (SecurityConfig(tls_cert_file=tmp_path / "nope.pem", tls_key_file=pki["key"]), "cannot read TLS certificate"),
        (SecurityConfig(tls_cert_file=pki["cert"], tls_key_file=tmp_path / "nope.key"), "cannot read TLS key"),
        (SecurityConfig(tls_cert_file=pki["cert"], tls_key_file=other_key), "do not load together"),
        (SecurityConfig(tls_cert_file=garbage, tls_key_file=pki["key"]), "do not load together"),
        (
            SecurityConfig(
                tls_cert_file=pki["cert"], tls_key_file=pki["key"], tls_ca_file=garbage, tls_client_auth="required"
            ),
            "no usable PEM",
        ),
    ]
    for sec, message in cases:
        with pytest.raises(ConfigError, match=message):
            server_context(sec)
    with pytest.raises(ConfigError, match="do not load together"):
        node_client_context(SecurityConfig(tls_cert_file=other_cert, tls_key_file=pki["key"]))
    with pytest.raises(ConfigError, match="cannot read TLS CA"):
        client_context(tmp_path / "nope-ca.pem")
