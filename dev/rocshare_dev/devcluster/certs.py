"""Certificates for the local control plane: a CA, the API server's serving cert,
client certs, and the service-account signing key. Loopback names only.

Like controller-runtime's envtest, everything is generated per cluster folder and
never leaves the machine; keys are 2048-bit RSA for speed, certs valid 30 days.

The CA carries a subject key identifier and every certificate it issues the matching
authority key identifier (RFC 5280 4.2.1.1-2), as kubeadm's do: Python 3.13's default TLS
context (VERIFY_X509_STRICT, the images' Python on Debian 13) refuses a chain without them
("Missing Authority Key Identifier"), so the operator and agent pods could not reach the API
server otherwise.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY))


def make_ca(folder: Path, name: str = "rocshare-local-ca") -> KeyPair:
    key = _new_key()
    subject = _name(name)
    cert = (_builder(subject, subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def issue(ca: KeyPair, folder: Path, file_stem: str, *, common_name: str, organization: str | None = None,
          dns_names: tuple[str, ...] = (), ip_addresses: tuple[str, ...] = (), server: bool = False) -> KeyPair:
    """A certificate signed by `ca`: a server cert with SANs, or a client cert (CN = user, O = group)."""
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (_builder(_name(common_name, organization), ca_cert.subject, key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(address)) for address in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = KeyPair(folder / f"{file_stem}.crt", folder / f"{file_stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def make_signing_key(folder: Path, file_stem: str = "service-account") -> KeyPair:
    """An RSA key pair for signing service-account tokens (`.crt` holds the public key)."""
    key = _new_key()
    pair = KeyPair(folder / f"{file_stem}.pub", folder / f"{file_stem}.key")
    pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    _write_key(key, pair.key)
    return pair
