"""What ``--format k8s`` names and checks (docs/export.md, "k8s.yaml"): the node label that
places pods (``SERVER_LABEL``), object names from plan and topology names (``object_name``,
``server_label``), the paths and names the objects share (TLS mounts, the controller's
Service, the plugin libraries), and :func:`check_k8s`, which refuses the ``--format k8s``
options a manifest cannot carry (an image reference that is not one or is not pinned, a
size that is not a quantity, a volume that is neither a claim nor an absolute path), one line
each, before anything is rendered. Light: ``re`` only."""

from __future__ import annotations

import re

from controller.errors import InputError
from controller.export.options import Options

# Nodes are chosen by this label, whose value is the topology's server name; the operator
# labels each node once (`kubectl label node NODE heroserve.io/server=srv0`).
SERVER_LABEL = "heroserve.io/server"
PART_OF = {"app.kubernetes.io/part-of": "heroserve"}

# The controller's Service: agents dial CONTROLLER_SERVICE:CONTROLLER_PORT (the controller's
# default --listen port), so its certificate needs `--host heroserve-controller`.
CONTROLLER_SERVICE = "heroserve-controller"
CONTROLLER_PORT = 50051
METRICS_PORT = 9100  # the controller's /metrics (docs/control-plane.md, "Metrics")
# Secrets the operator creates from `heroserve pki` (docs/control-plane.md): the CA's
# certificate under key ca.crt, and per identity a kubernetes.io/tls Secret.
CA_SECRET = "heroserve-ca"
TLS_DIR = "/etc/heroserve/tls"  # ca.crt, tls.crt, tls.key
TLS_FLAGS = [
    "--tls-ca", f"{TLS_DIR}/ca.crt", "--tls-cert", f"{TLS_DIR}/tls.crt",
    "--tls-key", f"{TLS_DIR}/tls.key",
]  # fmt: skip
# Where the HeroServe image holds the NCCL plugins (csrc/CMakeLists.txt's targets), which
# the GPU agent's DaemonSet copies onto the node for the engine pods.
IMAGE_LIB = "/opt/heroserve/lib"
PLUGIN_LIBS = ("libnccl-tuner-heroserve.so", "libnccl-net-heroserve.so")
MODELS = "/models"  # the model volume's mount point in engine pods

# Image references, after the grammar of distribution/reference (the one Docker and
# containerd parse): [DOMAIN[:PORT]/]PATH[:TAG][@DIGEST], path components lower case.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# a first component is a registry only with a '.' or a port, or as localhost (Docker's rule);
# otherwise it is a path component, lower case
_DOMAIN = rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+|{_LABEL}(?=:))(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REF = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
# A resource quantity as a sizeLimit takes it (a number and a binary or decimal suffix).
QUANTITY = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
# RFC 1123 names (Secrets, claims) and a resource name ([DNS-SUBDOMAIN/]NAME, e.g. rdma/hca).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
RESOURCE = re.compile(r"(?:[a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# A label value: 63 characters at most, alphanumerics at both ends, '-', '_', '.' between.
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def check_image(flag: str, ref: str) -> str:
    """``ref`` when it is an image reference pinned to a tag other than ``latest`` or to a
    digest; :class:`InputError` naming ``flag`` otherwise."""
    m = None if not ref.isascii() else IMAGE_REF.fullmatch(ref)
    if m is None or len(m["path"]) > 255:
        raise InputError(
            f"{flag} {ref!r} is not an image reference ([REGISTRY/]NAME[:TAG][@DIGEST])"
        )
    if not m["digest"] and m["tag"] in (None, "latest"):
        raise InputError(f"{flag} {ref!r}: pin a release (NAME:TAG or NAME@sha256:...), not latest")
    return ref


def _dns(flag: str, name: str) -> str:
    if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        raise InputError(f"{flag} {name!r}: lower case letters, digits, '-', '.'")
    return name


def model_volume(opts: Options) -> tuple[str, str] | None:
    """(``pvc`` | ``hostpath``, claim or directory) of ``--model-volume``, or None."""
    if not opts.model_volume:
        return None
    kind, _, where = opts.model_volume.partition(":")
    if kind == "pvc":
        return kind, _dns("--model-volume pvc:", where)
    if kind == "hostpath" and where.startswith("/") and where.isprintable() and ".." not in where:
        return kind, where
    raise InputError(f"--model-volume {opts.model_volume!r}: pvc:CLAIM or hostpath:/DIR")


def check_k8s(opts: Options) -> None:
    """:class:`InputError` naming the first ``--format k8s`` option a manifest cannot carry."""
    if not opts.heroserve_image:
        raise InputError(
            "--format k8s: pass --heroserve-image REF (the image with the controller, the agents "
            "and the NCCL plugins; docs/export.md)"
        )
    for flag, ref in (
        ("--heroserve-image", opts.heroserve_image),
        ("--image", opts.image),
        ("--router-image", opts.router_image),
    ):
        if ref:
            check_image(flag, ref)
    if opts.dev_shm != "host" and not QUANTITY.fullmatch(opts.dev_shm):
        raise InputError(f"--dev-shm {opts.dev_shm!r}: 'host' or a size such as 64Gi")
    if model_volume(opts) and not opts.model_path.startswith(MODELS + "/"):
        raise InputError(
            f"--model-volume is mounted at {MODELS}: pass --model-path {MODELS}/... (the "
            "checkpoint's folder in the volume)"
        )
    if opts.hf_token_secret:
        _dns("--hf-token-secret", opts.hf_token_secret)
    if opts.rdma_resource and not RESOURCE.fullmatch(opts.rdma_resource):
        raise InputError(f"--rdma-resource {opts.rdma_resource!r}: not a resource name (rdma/hca)")
    d = opts.plugin_dir
    if not d.startswith("/") or not d.isprintable() or ".." in d or any(c.isspace() for c in d):
        raise InputError(f"--plugin-dir {d!r}: an absolute path without '..' or spaces")


def object_name(*parts: str) -> str:
    """``heroserve-PART-...``: an RFC 1123 label (Services need one) from plan and topology
    names; :class:`InputError` when a name cannot make one (upper case, ``_``, ``:``)."""
    name = "-".join(("heroserve", *parts)).replace("/", "-")
    if len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        raise InputError(
            f"--format k8s: {name!r} is not a Kubernetes object name (63 lower-case letters, "
            "digits or '-'): rename the topology's node"
        )
    return name


def server_label(server: str) -> str:
    """``server`` as the value of ``SERVER_LABEL``; :class:`InputError` if it cannot be one."""
    if not LABEL_VALUE.fullmatch(server):
        raise InputError(
            f"--format k8s: server {server!r} cannot be the value of the node label "
            f"{SERVER_LABEL} (63 letters, digits, '-', '_', '.'): rename it in the topology"
        )
    return server
