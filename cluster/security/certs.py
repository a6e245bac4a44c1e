"""A certificate authority and node/client certificates for ``txbroker cluster init --secure``.

EC P-256 keys (``cryptography``), PEM files, private keys written with mode 0600.
The CA is valid for about ten years; a node certificate names its node
(``CN=txbroker-node-<id>``), carries the node's host as subject alternative
name (an IP address SAN for an IP, a DNS name otherwise; a loopback node
gets both ``127.0.0.1`` and ``localhost``) and serves as server and client
certificate, since nodes call each other. Client certificates (mTLS users)
carry the user name as CN.

The certificates pass OpenSSL's strict X.509 checks (critical basic
constraints, key usage, subject and authority key identifiers).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_VALIDITY",
    "NODE_VALIDITY",
    "certificate_covers",
    "make_ca",
    "make_client_certificate",
    "make_node_certificate",
    "node_common_name",
    "write_private",
]

CA_VALIDITY = dt.timedelta(days=3650)
NODE_VALIDITY = dt.timedelta(days=825)
CLIENT_VALIDITY = dt.timedelta(days=825)
_CLOCK_SKEW = dt.timedelta(minutes=5)  # not_before lies this far back, so a slightly slow clock accepts it
_LOOPBACK = ("127.0.0.1", "localhost")
_Key = ec.EllipticCurvePrivateKey


def node_common_name(node_id: int) -> str:
    return f"txbroker-node-{node_id}"


def _new_key() -> _Key:
    return ec.generate_private_key(ec.SECP256R1())


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (mode 0600 from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_pair(cert: x509.Certificate, key: _Key, cert_path: Path, key_path: Path) -> tuple[Path, Path]:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_private(key_path, key_pem)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _load_ca(ca_cert_path: Path | str, ca_key_path: Path | str) -> tuple[x509.Certificate, _Key]:
    ca_cert = x509.load_pem_x509_certificate(Path(ca_cert_path).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca_key_path).read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key_path}: the CA key is not an EC key")
    return ca_cert, ca_key


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "txbroker"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])  # fmt: skip


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates (and CRLs); an EC leaf signs its handshakes and agrees keys."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=not ca, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def make_ca(directory: Path | str, common_name: str = "txbroker CA") -> tuple[Path, Path]:
    """A self-signed CA: ``directory/ca.pem`` and ``directory/ca.key`` (0600)."""
    d = Path(directory)
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    name = _name(common_name)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write_pair(cert, key, d / "ca.pem", d / "ca.key")


def _alt_names(host: str) -> list[x509.GeneralName]:
    hosts = list(_LOOPBACK) if host in _LOOPBACK else [host]
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def _leaf(
    ca_cert_path: Path | str,
    ca_key_path: Path | str,
    common_name: str,
    alt_names: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> tuple[x509.Certificate, _Key]:
    ca_cert, ca_key = _load_ca(ca_cert_path, ca_key_path)
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_node_certificate(
    ca_cert_path: Path | str, ca_key_path: Path | str, directory: Path | str, node_id: int, host: str
) -> tuple[Path, Path]:
    """``directory/node-<id>.pem`` and ``.key`` (0600): CN ``txbroker-node-<id>``, SAN = ``host``,
    usable as server and as client certificate."""
    now = dt.datetime.now(dt.UTC)
    cert, key = _leaf(
        ca_cert_path, ca_key_path, node_common_name(node_id), _alt_names(host),
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], now - _CLOCK_SKEW, now + NODE_VALIDITY,
    )  # fmt: skip
    d = Path(directory)
    return _write_pair(cert, key, d / f"node-{node_id}.pem", d / f"node-{node_id}.key")


def make_client_certificate(
    ca_cert_path: Path | str,
    ca_key_path: Path | str,
    directory: Path | str,
    common_name: str,
    *,
    not_after: dt.datetime | None = None,
) -> tuple[Path, Path]:
    """A client certificate for mTLS (principal ``User:<common_name>``): ``directory/<name>.pem`` and ``.key``.

    ``not_after`` in the past makes an expired certificate (valid for the day before it)."""
    if not common_name or not common_name.isprintable() or ":" in common_name:
        raise ValueError(f"bad client certificate common name {common_name!r}")
    now = dt.datetime.now(dt.UTC)
    end = not_after if not_after is not None else now + CLIENT_VALIDITY
    start = min(now - _CLOCK_SKEW, end - dt.timedelta(days=1))
    cert, key = _leaf(ca_cert_path, ca_key_path, common_name, [], [ExtendedKeyUsageOID.CLIENT_AUTH], start, end)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", common_name)
    d = Path(directory)
    return _write_pair(cert, key, d / f"{stem}.pem", d / f"{stem}.key")


def certificate_covers(cert_path: Path | str, ca_cert_path: Path | str, host: str) -> bool:
    """Whether the certificate at ``cert_path`` is issued by the CA, unexpired, and names ``host`` in its SAN."""
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        ca = x509.load_pem_x509_certificate(Path(ca_cert_path).read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        return False
    names: set[str] = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    names.update(san.get_values_for_type(x509.DNSName))
    return all(str(n.value) in names for n in _alt_names(host))
