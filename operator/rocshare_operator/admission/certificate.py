"""The webhook's self-signed TLS material, as the dev overlay has the operator own it: a CA and
a serving certificate for ``<service>.<namespace>.svc``, kept in one ``kubernetes.io/tls``
Secret (``tls.crt``, ``tls.key``, ``ca.crt``), and the decision when to make new ones.

Pure: no API calls, no clock (callers pass ``now``), no files. ``ca.crt`` may hold two CAs
after a renewal -- the new one first, the previous one while it is still valid -- so that an
API server still calling with the old ``caBundle`` can verify either certificate.
"""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class TlsBundle:
    ca_pem: bytes  # one or more CA certificates, the current one first
    cert_pem: bytes
    key_pem: bytes

    def secret_data(self) -> dict[str, str]:
        return {key: base64.b64encode(value).decode() for key, value in
                (("ca.crt", self.ca_pem), ("tls.crt", self.cert_pem), ("tls.key", self.key_pem))}

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> TlsBundle | None:
        """The bundle in a Secret's `data`, or None when a key is missing or not base64."""
        try:
            raw = {key: base64.b64decode((data or {})[key], validate=True) for key in ("ca.crt", "tls.crt", "tls.key")}
        except (KeyError, ValueError):
            return None
        return cls(ca_pem=raw["ca.crt"], cert_pem=raw["tls.crt"], key_pem=raw["tls.key"])


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    return (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local",
            f"{service}.{namespace}", service)


def issue(service: str, namespace: str, *, now: datetime.datetime, validity: datetime.timedelta = VALIDITY,
          previous: TlsBundle | None = None) -> TlsBundle:
    """A new CA and a serving certificate signed by it; `previous`'s first CA is kept second in
    ``ca.crt`` while it is still valid (see the module docstring)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace} webhook CA")])
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key(), now, validity)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = service_dns_names(service, namespace)
    cert = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]), ca_name, key.public_key(),
                     now, validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    if previous is not None:
        old = _first_certificate(previous.ca_pem)
        if old is not None and old.not_valid_after_utc > now:
            ca_pem += old.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return TlsBundle(ca_pem=ca_pem, cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_pem)


def renewal_reason(bundle: TlsBundle | None, service: str, namespace: str, *, now: datetime.datetime,
                   renew_before: datetime.timedelta = RENEW_BEFORE) -> str | None:
    """Why `bundle` must be replaced (missing, unreadable, wrong names, not signed by its CA,
    key not matching, expiring within `renew_before`), or None when it is good to serve."""
    if bundle is None:
        return "missing"
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert_pem)
        key = serialization.load_pem_private_key(bundle.key_pem, password=None)
        ca = _first_certificate(bundle.ca_pem)
    except ValueError as error:
        return f"unreadable ({error})"
    if ca is None:
        return "unreadable (no CA certificate)"
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        return "the key does not match the certificate"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as error:
        return f"not signed by the CA in ca.crt ({type(error).__name__})"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        sans = []
    wanted = service_dns_names(service, namespace)[0]
    if wanted not in sans:
        return f"does not name {wanted}"
    expires = min(cert.not_valid_after_utc, ca.not_valid_after_utc)
    if expires - now < renew_before:
        return f"expires {expires.isoformat()}"
    if cert.not_valid_before_utc > now + _CLOCK_SKEW:
        return "not valid yet"
    return None


def _builder(subject: x509.Name, issuer: x509.Name, public_key, now: datetime.datetime,
             validity: datetime.timedelta) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + validity))


def _first_certificate(pem: bytes) -> x509.Certificate | None:
    certificates = x509.load_pem_x509_certificates(pem) if pem.strip() else []
    return certificates[0] if certificates else None
