"""The offline checks of ``--format k8s`` manifests, for the tests and by hand
(``python -m tests.controller.export.k8s_validate k8s.yaml``): every object with
``kubernetes-validate --strict`` against the Kubernetes schemas, except LeaderWorkerSets,
which those hold no schema for: they are checked against the LeaderWorkerSet project's own
CRD (``schemas/``, README there) with ``jsonschema``, strictly (an unknown field is an error,
as with ``kubectl apply --validate=strict``), and their pod templates again as PodTemplates
with ``kubernetes-validate --strict`` (the CRD's copy of the pod schema is the same fields,
the Kubernetes one checks formats too)."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

K8S = "1.30.0"  # the oldest Kubernetes the LeaderWorkerSet release v0.10.0 supports
LWS_CRD = Path(__file__).parent / "schemas" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def _strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever an object lists its
    properties and neither allows more nor keeps unknown fields (what a structural schema
    prunes, strict field validation refuses)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):  # fmt: skip
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


@functools.cache
def lws_schema() -> dict[str, Any]:
    crd = yaml.safe_load(LWS_CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(v1["schema"]["openAPIV3Schema"])
    return _strict(schema)


def pod_templates(doc: dict) -> list[dict]:
    if doc["kind"] in ("Deployment", "DaemonSet"):
        return [doc["spec"]["template"]]
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        return [t["leaderTemplate"], t["workerTemplate"]]
    return []


def problems(doc: dict) -> list[str]:
    """What is wrong with one manifest: empty when it validates."""
    if doc.get("kind") != "LeaderWorkerSet":
        try:
            kubernetes_validate.validate(doc, K8S, strict=True)
        except kubernetes_validate.ValidationError as e:
            return [f"{doc.get('kind')} {doc['metadata'].get('name')}: {e.message}"]
        return []
    name = doc["metadata"].get("name")
    v = jsonschema.Draft7Validator(lws_schema())
    out = [f"LeaderWorkerSet {name}: {'.'.join(map(str, e.path))}: {e.message}"
           for e in v.iter_errors(doc)]  # fmt: skip
    if doc["apiVersion"] != "leaderworkerset.x-k8s.io/v1":
        out.append(f"LeaderWorkerSet {name}: apiVersion {doc['apiVersion']}")
    for i, t in enumerate(pod_templates(doc) if not out else []):
        tmpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{i}"},
                "template": t}  # fmt: skip
        out += problems(tmpl)
    return out


def main(argv: list[str]) -> int:
    bad = 0
    for path in argv:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        for d in docs:
            for p in problems(d):
                print(p)
                bad += 1
        kinds = sorted({d["kind"] for d in docs})
        print(f"{path}: {len(docs)} objects ({', '.join(kinds)}), {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
