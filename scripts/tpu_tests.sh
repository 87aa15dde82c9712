#!/usr/bin/env bash
# The chip's test tier: the tests whose code paths or numbers change on an accelerator (the Pallas kernels against
# their XLA references, the model, the train step, the accelerator benchmarks, weights and checkpoints restored onto
# the chip from another device set), on an accelerator machine set up by scripts/tpu_setup.sh (no Prefect there, no
# TCP sockets), in ONE process (a TPU chip admits one process: no pytest-xdist), tpu-marked tests included and slow
# ones left out as in `make test` (add `-m ''` for them). Installs pytest and hypothesis into the same target when the
# machine lacks them. Tests of the CPU backend (marked cpu_only) skip on a chip.
#
# JAX runs on the machine's accelerator: JAX_PLATFORMS is set empty (JAX picks the accelerator), over the `cpu` that
# the Makefile exports and tests/conftest.py assumes for the CPU suite; on a machine where JAX finds no accelerator
# the tier refuses to run (it would pass without testing anything of the chip).
#
# Run whole (no arguments), it writes pytest's JUnit report to bench/tpu_tier.xml, its suite named after the chip, and
# records it (`python -m bench.cli --only tpu_tier`: tpu.tier.* in bench/results.json and BENCHMARKS.md); with
# arguments (a part of the tier, `-m ''`, `-k ...`) it runs them and records nothing.
#
#   scripts/tpu_tests.sh [PYTEST ARGS...]     (run from anywhere; exit status: pytest's, 2 without an accelerator)
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
export JAX_PLATFORMS=
# One process opens the accelerator for both answers (each start of its runtime takes seconds).
read -r backend chip < <("$python" -c 'import jax; print(jax.default_backend(), jax.devices()[0].device_kind)')
[[ -n ${backend:-} ]] || { echo "tpu_tests: $python could not start JAX (its error is above)" >&2; exit 2; }
if [[ $backend == cpu ]]; then
  echo "tpu_tests: JAX finds no accelerator on this machine (its backend is cpu); the tier runs on a chip" >&2
  exit 2
fi
tier=(tests/test_train_step.py tests/test_bench_tpu.py tests/test_model.py tests/test_paged_attention.py
      tests/test_restore_topology.py)
if (($#)); then  # a part of the tier, or more of it: its result is not the tier's
  exec "$python" -m pytest -q -p no:cacheprovider -p no:xdist "${tier[@]}" "$@"
fi
"$python" -m pytest -q -p no:cacheprovider -p no:xdist "${tier[@]}" \
  --junitxml=bench/tpu_tier.xml -o junit_suite_name="$chip" && rc=0 || rc=$?
"$python" -m bench.cli --only tpu_tier >&2 || echo "tpu_tests: the report is bench/tpu_tier.xml; recording it failed" >&2
exit "$rc"
