"""A throw-away PKI for tests: a CA and the certificates it signs, in memory, made by the
same code as `heroserve pki` (controller/cli/pki.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controller.cli.pki import new_ca, pem, sign_leaf


@dataclass
class Cert:
    cert: bytes  # PEM
    key: bytes  # PEM

    def write(self, directory: Path, name: str) -> tuple[str, str]:
        c, k = directory / f"{name}.crt", directory / f"{name}.key"
        c.write_bytes(self.cert)
        k.write_bytes(self.key)
        return str(c), str(k)


class CA:
    def __init__(self, name: str = "heroserve test CA") -> None:
        self.cert, self.key = new_ca(name, days=1)

    @property
    def pem(self) -> bytes:
        return pem(self.cert)

    def issue(
        self, cn: str, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), server: bool = False
    ) -> Cert:
        """A certificate for ``cn`` (SAN ``cn``, ``dns`` and ``ips``), client or server usage."""
        cert, key = sign_leaf(self.cert, self.key, cn, server, [*dns, *ips], days=1)
        return Cert(pem(cert), pem(key))
