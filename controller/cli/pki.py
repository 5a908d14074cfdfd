"""``heroserve pki``: a certificate authority and the certificates mutual TLS needs.

See docs/design.md §9.

    heroserve pki init DIR [--name "HeroServe CA"] [--days 3650]
    heroserve pki issue DIR --name NODE [--server] [--host NAME_OR_IP ...] [--days 398]

``init`` writes ``DIR/ca.crt`` and ``DIR/ca.key``. ``issue`` writes ``DIR/NODE.crt`` and
``DIR/NODE.key`` signed by that CA. The controller binds an agent to the names its client
certificate carries, the subject CN and every SAN DNS entry (controller/service/servicer.py
``peer_names``): a certificate issued with ``--name s1`` speaks for node ``s1`` and no other,
``--name heroserve-admin`` may call the Admin service. ``--server`` makes a server
certificate (the controller's): its SAN also lists every ``--host``, which is what agents
check against the address they dial (or their ``--tls-server-name``).

Keys are ECDSA P-256 (what gRPC's BoringSSL and the C++ agent's OpenSSL both accept), written
with mode 0600. Existing files are never overwritten unless ``--force``.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from agents.cliutil import DefaultsHelpFormatter
from controller.errors import InputError

CA_DAYS = 3650  # a private root outlives the certificates it signs; renew it by hand
# CA/Browser Forum Baseline Requirements cap a TLS certificate at 398 days since 2020-09.
LEAF_DAYS = 398
_CERTS = ("Issued", "init_ca", "issue", "load_ca", "new_ca", "pem", "sign_leaf")


def __getattr__(name: str) -> Any:
    """The certificate functions, from ``controller.cli.certs`` (PEP 562: imported when first
    named, so that ``heroserve pki --help`` does not import cryptography)."""
    if name in _CERTS:
        return getattr(importlib.import_module("controller.cli.certs"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- command line ----------------------------------------------------------------------------


def _folder(s: str) -> Path:
    """DIR: '' would be the current folder (``Path('')`` is ``.``), never what is meant."""
    if not s:
        raise argparse.ArgumentTypeError("an empty path: name the CA's folder")
    return Path(s)


def add_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="pki_action", required=True)
    fmt = DefaultsHelpFormatter
    i = sub.add_parser("init", help="create a CA (DIR/ca.crt, DIR/ca.key)", formatter_class=fmt)
    i.add_argument("dir", type=_folder, help="folder for the CA and the certificates it issues")
    i.add_argument("--name", default="HeroServe CA", help="the CA's common name")
    i.add_argument("--days", type=int, default=CA_DAYS, help="validity in days")
    i.add_argument("--force", action="store_true", help="replace existing files")
    s = sub.add_parser(
        "issue", help="issue DIR/NAME.crt and DIR/NAME.key signed by DIR's CA", formatter_class=fmt
    )
    s.add_argument("dir", type=_folder, help="folder of a CA made by `heroserve pki init`")
    s.add_argument(
        "--name",
        required=True,
        help="node the certificate speaks for (topology node name, e.g. s1 or srv0; "
        "heroserve-admin for the Admin service; the controller's own name with --server)",
    )
    s.add_argument("--server", action="store_true", help="a server certificate (controller)")
    s.add_argument(
        "--host",
        action="append",
        default=[],
        help="with --server: a DNS name or IP address agents dial (repeat)",
    )
    s.add_argument("--days", type=int, default=LEAF_DAYS, help="validity in days")
    s.add_argument("--force", action="store_true", help="replace existing files")


def run(a: argparse.Namespace) -> int:
    certs = importlib.import_module("controller.cli.certs")  # cryptography (not a cycle)
    if a.pki_action == "init":
        out = certs.init_ca(a.dir, a.name, a.days, a.force)
        print(f"CA written: {out.cert} (share it) and {out.key} (keep it secret)")
        return 0
    if a.host and not a.server:
        raise InputError("--host is for server certificates: add --server")
    out = certs.issue(a.dir, a.name, a.server, a.host, a.days, a.force)
    kind = "server" if a.server else "client"
    print(f"{kind} certificate for {a.name!r} written: {out.cert} and {out.key}")
    return 0
