"""The fast tier's credentials: a CA, the server's certificate, a client certificate, a token, a kubeconfig.

Everything is made fresh with ``cryptography`` in the server's directory at each start, so no
key outlives the run and nothing is shared between servers. The kubeconfig has two contexts
over the same cluster entry (the CA, the server's URL): ``token`` (a bearer token, the current
context) and ``cert`` (the client certificate), because real clusters hand out both and the
clients read them through different code paths.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Credentials", "make_credentials", "write_kubeconfig"]

CLUSTER = "rx-fast"
CLIENT_USER = "rx-fast-admin"


@dataclass(frozen=True)
class Credentials:
    """Paths (in the server's directory) and the token."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    token: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    """A key file readable by its owner only (kubectl and the clients do not mind; people might)."""
    path.write_bytes(data)
    path.chmod(0o600)


def make_credentials(d: Path) -> Credentials:
    """Write ``ca.crt``, ``server.crt/.key``, ``client.crt/.key`` and ``token`` into ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("rx-fast-ca")

    def builder(subject: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
        )

    ca = (
        builder(ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())

    def leaf(stem: str, cn: str, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = (
            builder(_name(cn), key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(authority, critical=False)
        )
        if server:
            alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        (d / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(d / f"{stem}.key", _pem_key(key))

    leaf("server", "rx-fast-apiserver", server=True)
    leaf("client", CLIENT_USER, server=False)
    token = secrets.token_urlsafe(24)
    _write_private(d / "token", token.encode())
    return Credentials(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key", token)


def write_kubeconfig(path: Path, url: str, creds: Credentials) -> None:
    """A kubeconfig (JSON is YAML) with contexts ``token`` (current) and ``cert``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": url, "certificate-authority": str(creds.ca)}}],
        "users": [
            {"name": "token", "user": {"token": creds.token}},
            {
                "name": "cert",
                "user": {"client-certificate": str(creds.client_cert), "client-key": str(creds.client_key)},
            },
        ],
        "contexts": [
            {"name": "token", "context": {"cluster": CLUSTER, "user": "token", "namespace": "default"}},
            {"name": "cert", "context": {"cluster": CLUSTER, "user": "cert", "namespace": "default"}},
        ],
        "current-context": "token",
        "preferences": {},
    }
    tmp = path.with_suffix(".tmp")
    _write_private(tmp, json.dumps(config, indent=2).encode())
    tmp.rename(path)  # whole or absent: the fixture reads it once the ready line is out
