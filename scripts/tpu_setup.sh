#!/usr/bin/env bash
# Make a rollstream checkout runnable on an accelerator machine that installs packages from a local index (no
# network, no root) and already has JAX: installs what the library needs and the machine's Python lacks into a
# target folder, keeps the machine's own JAX in force, checks the imports, and prints the PYTHONPATH to use (one
# `export` line on stdout; progress on stderr).
#
#   eval "$(scripts/tpu_setup.sh [TARGET])"   TARGET default: build/tpu-site in the checkout
#   PYTHON=python3                         the machine's Python (the one with JAX)
#   INDEX_URL=file:///opt/pypi/simple      the local package index
#
# Installed: the library's runtime needs without Prefect (the colocated runner, `python -m pipelines_lib.cli` and
# the benchmarks never import it) but with matplotlib (the benchmarks' plots); not gcsfs (a machine without sockets
# keeps campaigns on its own disk) nor duckdb (SQL over a campaign, not the campaign itself).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-$root/build/tpu-site}
python=${PYTHON:-python3}
index=${INDEX_URL:-file:///opt/pypi/simple}
needs=(flax optax orbax-checkpoint tensorstore pyarrow transformers tokenizers safetensors pyyaml psutil httpx numpy google-crc32c
       matplotlib)

"$python" -c "import jax" || { echo "tpu_setup: $python cannot import jax; set PYTHON to the machine's Python" >&2; exit 2; }
mkdir -p "$target"
missing=()
for pkg in "${needs[@]}"; do
  module=${pkg//-/_}
  case $pkg in orbax-checkpoint) module=orbax.checkpoint ;; pyyaml) module=yaml ;; esac
  PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$target" "$python" -c "import $module" 2>/dev/null || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "tpu_setup: installing ${missing[*]} into $target" >&2
  PIP_CONFIG_FILE=/dev/null "$python" -m pip install --isolated --only-binary=:all: --index-url "$index" \
    --target "$target" --upgrade "${missing[@]}" >&2
fi
# A dependency may bring its own JAX (or numpy, libtpu): the machine's, built for its chip, must win, so the target
# comes last on PYTHONPATH, after whatever the machine's Python already finds there.
pythonpath="$root${PYTHONPATH:+:$PYTHONPATH}:$target"
PYTHONPATH="$pythonpath" "$python" - <<'EOF'
import sys
import tempfile

import jax

import bench.tpu  # noqa: F401 - the benchmarks import
import pipelines_lib.stages.colocated  # noqa: F401 - the colocated runner imports
from pipelines_lib.demo import run_demo

# `rollstream demo` (shards written, tailed, audited): a library version that imports cleanly can still fail
# there (a pyarrow that wanted pandas did, on every shard commit of a campaign).
with tempfile.TemporaryDirectory() as tmp:
    if not run_demo(tmp, echo=lambda line: None).report.ok:
        sys.exit("tpu_setup: the store demo's audit failed")
print(f"tpu_setup: ok; JAX {jax.__version__} from {jax.__file__}", file=sys.stderr, flush=True)
EOF
echo "export PYTHONPATH=$pythonpath"
