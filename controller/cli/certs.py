"""The certificate authority and certificates of ``heroserve pki`` (controller/cli/pki.py,
whose docstring says what they are for): :func:`init_ca`, :func:`issue`, and the pieces tests
use (:func:`new_ca`, :func:`sign_leaf`, :func:`pem`). Imports ``cryptography``, so that the
command's ``--help`` does not."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agents.cliutil import UsageError, read_regular
from controller.cli.pki import CA_DAYS, LEAF_DAYS
from controller.errors import InputError

# A node name is a topology node name and goes into a DNS SAN: DNS label characters and
# dots, at most 64 characters (the X.520 upper bound of a common name).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InputError(
            f"--name {name!r}: a node name is 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _write(path: Path, data: bytes, private: bool, force: bool) -> None:
    """Create ``path`` anew (mode 0600 for a key, 0644 otherwise). A symbolic link there is
    refused, even with ``force``, and the file is opened with O_EXCL | O_NOFOLLOW: a link
    planted between the check and the write (dangling ones included) makes the open fail,
    so a key is never written into a file the link points at."""
    if path.is_symlink():
        raise InputError(f"{path} is a symbolic link: refusing to write a key or certificate "
                         "through it")  # fmt: skip
    if os.path.lexists(path) and not force:
        raise InputError(f"{path} exists; pass --force to replace it")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if force and os.path.lexists(path):
            path.unlink()  # removes the file itself: it is not a link (checked above)
        # never readable by others, not even for an instant
        fd = os.open(path, flags, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except FileExistsError:
        raise InputError(f"{path} appeared while writing it: refusing to replace it") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if not 1 <= days <= 36500:
        raise InputError(f"--days {days} is not in 1..36500")
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)  # 5 min of clock skew


def _usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(name: str, days: int = CA_DAYS) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate ``name`` (P-256, may sign leaves only) and its key, in
    memory: ``init_ca`` writes them, tests use them as they are."""
    start, end = _validity(days)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def sign_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    name: str,
    server: bool = False,
    hosts: list[str] | None = None,
    days: int = LEAF_DAYS,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate for ``name`` (CN and SAN DNS ``name``, plus ``hosts``) signed by
    the CA, client or server usage, and its key, in memory."""
    start, end = _validity(days)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(end, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(_san(name, hosts or []), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def pem(item: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    """PEM bytes of a certificate or (unencrypted PKCS#8) private key."""
    if isinstance(item, x509.Certificate):
        return item.public_bytes(serialization.Encoding.PEM)
    return _key_pem(item)


def _save(
    out: Issued, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, force: bool
) -> Issued:
    for p in (out.cert, out.key):  # check both before writing either
        if p.is_symlink():
            raise InputError(f"{p} is a symbolic link: refusing to write through it")
        if os.path.lexists(p) and not force:
            raise InputError(f"{p} exists; pass --force to replace it")
    _write(out.key, pem(key), private=True, force=force)
    _write(out.cert, pem(cert), private=False, force=force)
    return out


def init_ca(
    directory: Path, name: str = "HeroServe CA", days: int = CA_DAYS, force: bool = False
) -> Issued:
    """Create a self-signed CA in ``directory``."""
    if not name.strip() or len(name) > 64 or not name.isprintable():
        raise InputError("--name of a CA is 1-64 printable characters (no control characters)")
    cert, key = new_ca(name, days)
    return _save(Issued(directory / "ca.crt", directory / "ca.key"), cert, key, force)


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA of ``directory`` (``ca.crt``, ``ca.key``), checked to belong together."""
    for f in ("ca.crt", "ca.key"):
        if not (directory / f).exists():
            raise InputError(f"{directory / f} is missing: run `heroserve pki init {directory}`")
    try:
        crt, key_pem = (
            read_regular(directory / f, "CA file", 1 << 20) for f in ("ca.crt", "ca.key")
        )
    except UsageError as exc:
        raise InputError(str(exc)) from None
    try:
        cert = x509.load_pem_x509_certificate(crt)
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{directory}: not a CA made by `heroserve pki init` ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key().public_numbers() != (
        cert.public_key().public_numbers()  # type: ignore[union-attr]
    ):
        raise InputError(f"{directory}: ca.key does not belong to ca.crt")
    return cert, key


def _san(name: str, hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = [x509.DNSName(name)]
    for h in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not _NAME.fullmatch(h):
                raise InputError(f"--host {h!r} is neither an IP address nor a DNS name") from None
            entries.append(x509.DNSName(h))
    unique = list(dict.fromkeys(entries))
    return x509.SubjectAlternativeName(unique)


def issue(
    directory: Path,
    name: str,
    server: bool = False,
    hosts: list[str] | None = None,
    days: int = LEAF_DAYS,
    force: bool = False,
) -> Issued:
    """A certificate for node ``name`` (CN and SAN DNS ``name``), signed by the CA of
    ``directory``; a server certificate when ``server`` (SAN also ``hosts``)."""
    _check_name(name)
    if name == "ca":
        raise InputError("--name ca would overwrite the CA's own files")
    ca_cert, ca_key = load_ca(directory)
    cert, key = sign_leaf(ca_cert, ca_key, name, server, hosts, days)
    return _save(Issued(directory / f"{name}.crt", directory / f"{name}.key"), cert, key, force)
