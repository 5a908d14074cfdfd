"""Build hook (everything else is in pyproject.toml): the wheel carries the generated gRPC
stubs, made here by grpcio-tools from proto/, and copies of the .proto files, the P4
programs and the P4Info under agents/_data/ (found at run time by agents.resources)."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = [
    "proto/heroserve/v1/control.proto",
    "p4/heroserve_ina.p4",
    "p4/tna/heroserve_ina.p4",
    "p4/heroserve_ina.p4info.txtpb",
]


def _build_proto():  # noqa: ANN202 - the module proto/build_proto.py, loaded by path
    spec = importlib.util.spec_from_file_location(
        "build_proto", ROOT / "proto" / "build_proto.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        lib = Path(self.build_lib)
        gen = _build_proto()
        gen.build(ROOT / "proto", lib / gen.OUT_DIR.relative_to(ROOT))
        for rel in SHIPPED:
            dst = lib / "agents" / "_data" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, dst)


setup(cmdclass={"build_py": BuildPyWithStubs})
