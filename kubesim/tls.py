"""A throw-away self-signed certificate, so kubectl (which sends bearer tokens only over TLS) can connect, and a
client certificate it signs, for kubeconfigs that authenticate as kind's and k3s's do (``client-certificate-data``).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVER_NAME = "kubesim.cluster.local"  # also in the certificate, for kubeconfigs that set tls-server-name


def self_signed(directory: Path, host: str) -> tuple[ssl.SSLContext, bytes, tuple[bytes, bytes]]:
    """Create a key and certificate for ``host`` (plus 127.0.0.1, localhost and ``SERVER_NAME``); return the
    server context (which also verifies client certificates this CA signed), the certificate's PEM, which doubles
    as the CA a client must trust, and a client certificate and key (PEM) signed by it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubesim")])
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName(SERVER_NAME),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    try:
        address = ipaddress.ip_address(host)
        if str(address) != "127.0.0.1":
            names.append(x509.IPAddress(address))
    except ValueError:
        names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    key_path, cert_path = directory / "kubesim-tls.key", directory / "kubesim-tls.crt"
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    key_path.unlink()  # loaded into the context; nothing secret stays on disk
    cert_path.unlink()
    # A client certificate is optional (bearer tokens still work); one presented must be signed by this CA.
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=cert_pem.decode())
    return context, cert_pem, _client_certificate(certificate, key, now)


def _client_certificate(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, now: datetime.datetime
) -> tuple[bytes, bytes]:
    """A client certificate for the cluster's admin (O=system:masters, as kind's and k3s's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "kubesim-admin"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return (
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
