"""Generate the Python gRPC stubs of ``proto/**/*.proto`` into ``agents/proto/``.

Run as ``python -m proto.build_proto`` (``make proto``). The generated modules are
importable as ``agents.proto.heroserve.v1.control_pb2`` (and ``..._pb2_grpc``): protoc
writes absolute imports (``from heroserve.v1 import control_pb2``), which this script
rewrites to relative ones so that ``agents/proto`` need not be on ``sys.path``. They live
under ``agents/`` because the agents and the controller both import them, and an agent is
installed without the controller (docs/install.md).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "agents" / "proto"

# "from heroserve.v1 import control_pb2 as ..." -> "from . import control_pb2 as ..."
_ABS_IMPORT = re.compile(r"^from (heroserve(?:\.\w+)*) import (\w+_pb2)", re.MULTILINE)


def _relative(module_pkg: str, target_pkg: str) -> str:
    """The relative-import prefix from package ``module_pkg`` to ``target_pkg``."""
    here = module_pkg.split(".")
    there = target_pkg.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    ups = len(here) - common
    return "." * (ups + 1) + ".".join(there[common:])


def _fix_imports(path: Path, out_dir: Path) -> None:
    pkg = ".".join(path.relative_to(out_dir).parent.parts)
    text = path.read_text()
    fixed = _ABS_IMPORT.sub(
        lambda m: f"from {_relative(pkg, m.group(1))} import {m.group(2)}", text
    )
    if fixed != text:
        path.write_text(fixed)


def build(proto_dir: Path = PROTO_DIR, out_dir: Path = OUT_DIR) -> list[Path]:
    """Run protoc on every ``.proto`` under ``proto_dir``; return the generated files."""
    # Imported here: only the build needs grpc_tools.
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(proto_dir.rglob("*.proto"))
    if not protos:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(proto_dir)) for p in protos],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with status {rc}")
    generated = sorted(p for p in out_dir.rglob("*_pb2*") if p.suffix in (".py", ".pyi"))
    for d in [out_dir, *(p for p in out_dir.rglob("*") if p.is_dir())]:
        init = d / "__init__.py"
        if not init.exists():
            init.write_text("")
    for p in generated:
        _fix_imports(p, out_dir)
    return generated


def main(argv: list[str] | None = None) -> int:
    try:
        files = build()
    except RuntimeError as exc:
        print(f"build_proto: {exc}", file=sys.stderr)
        return 2
    print(f"build_proto: generated {len(files)} files in {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
