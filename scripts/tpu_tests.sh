#!/usr/bin/env bash
# The chip's test tier: the tests that compare kernels with XLA and run the benchmarks' code paths, on an accelerator
# machine set up by scripts/tpu_setup.sh (no Prefect there, no TCP sockets), in ONE process (a TPU chip admits one
# process: no pytest-xdist), tpu-marked tests included and slow ones left out as in `make test` (add `-m ''` for
# them). Installs pytest and hypothesis into the same target when the machine lacks them. Tests of the CPU backend
# (marked cpu_only) skip on a chip.
#
#   scripts/tpu_tests.sh [PYTEST ARGS...]     (run from anywhere; exit status: pytest's)
#   PYTHON=python3  TARGET=build/tpu-site  INDEX_URL=file:///opt/pypi/simple   as scripts/tpu_setup.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=${TARGET:-$root/build/tpu-site}
python=${PYTHON:-python3}
index=${INDEX_URL:-file:///opt/pypi/simple}
eval "$(PYTHON="$python" INDEX_URL="$index" "$root/scripts/tpu_setup.sh" "$target")"
missing=()
for pkg in pytest hypothesis; do
  "$python" -c "import $pkg" 2>/dev/null || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "tpu_tests: installing ${missing[*]} into $target" >&2
  PIP_CONFIG_FILE=/dev/null "$python" -m pip install --isolated --only-binary=:all: --index-url "$index" \
    --target "$target" "${missing[@]}" >&2
fi
cd "$root"
exec "$python" -m pytest -q -p no:cacheprovider -p no:xdist \
  tests/test_train_step.py tests/test_bench_tpu.py tests/test_model.py tests/test_paged_attention.py "$@"
