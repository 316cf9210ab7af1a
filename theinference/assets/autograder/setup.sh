#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
# Written by `theinference autograder gradescope`; the settings are in bundle.env beside it.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
# shellcheck source=/dev/null
source "$SOURCE/bundle.env"
export THEINFERENCE_CACHE="$ROOT/cache"  # run_autograder reads the cache proof's weights from here

export DEBIAN_FRONTEND=noninteractive
apt-get update
# bubblewrap: the sandbox student code runs in; theinference reports which confinement is active.
apt-get install -y --no-install-recommends bubblewrap ca-certificates python3 python3-venv
PYTHON=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    # theinference needs Python >= 3.11; Ubuntu 22.04's python3 is 3.10.
    apt-get install -y --no-install-recommends python3.11 python3.11-venv
    PYTHON=python3.11
fi

"$PYTHON" -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --upgrade pip
# This very version of theinference (stages and course included), and its dependencies from PyPI.
"$ROOT/venv/bin/python" -m pip install "$SOURCE/$WHEEL"

# The TypeScript edition's submissions (tests/adapters.ts) run on Node.js (20 or later, as theinference requires)
# with tsx, installed into $ROOT/node_modules: the nearest node_modules above every submission, where theinference
# looks for it. A distribution's own nodejs package may be older (Ubuntu 22.04's is 12): then it says so.
if ! command -v node >/dev/null; then
    apt-get install -y --no-install-recommends nodejs npm || echo "note: no Node.js: TypeScript submissions cannot be graded"
fi
if command -v node >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
    echo "note: Node.js $(node --version) is older than 20: TypeScript submissions cannot be graded (install Node.js 20)"
fi
if command -v npm >/dev/null; then
    npm install --prefix "$ROOT" --no-audit --no-fund tsx@4 || echo "note: no tsx: TypeScript submissions cannot be graded"
fi

if [ -n "$WEIGHTS_PRESET" ]; then
    # Synthetic weights are deterministic: the same preset and seed give the same bytes everywhere.
    "$ROOT/venv/bin/theinference" weights synth --preset "$WEIGHTS_PRESET" --seed "$WEIGHTS_SEED" --out "$SOURCE/weights"
fi
"$ROOT/venv/bin/theinference" weights info "$SOURCE/weights/model.safetensors"
# cache-scaling runs on weights of its own (the synthetic proof preset): made once here, not at every submission.
"$ROOT/venv/bin/python" - <<'PY'
from theinference.grading.judge.scaling import PROOF_PRESET
from theinference.model.weights_choice import WeightsChoice, ensure_weights, synthetic_path

made = WeightsChoice(synthetic_path(PROOF_PRESET), "synthetic-preset", "cache-scaling", PROOF_PRESET)
ensure_weights(made)
print(f"the cache proof's weights: {made.path}")
PY

