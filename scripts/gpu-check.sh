#!/usr/bin/env bash
# The GPU path on one GPU machine, in at most 8 minutes: NCCL env contract (1x1), our NVML
# sampler against nvidia-smi, the checkpoint stall against the pinned D2H floor and
# torch.save, a forced CUDA OOM's diagnosis, and a tutorial-style DDP script (1x1) saving and
# resuming a snapshot. One line per check; the lines are appended to benchmarks/HISTORY.md.
#
#   bash scripts/gpu-check.sh [env|sampler|checkpoint|oom|tutorial ...]
#
# Without a GPU it stops at once, says why, and exits 2 (HISTORY.md is left alone).
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
LIMIT=${GPU_CHECK_SECONDS:-480}

fail() { echo "gpu-check: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this is not a GPU machine (or the driver is missing)"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1) || fail "nvidia-smi failed: $gpus"
[ -n "$gpus" ] || fail "nvidia-smi lists no GPU"
$python - <<'PY' || fail "torch cannot use the GPU (see above); install a CUDA build of torch"
import sys, torch
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} (cuda {torch.version.cuda}) sees no usable GPU", file=sys.stderr)
    sys.exit(1)
PY
$python -c "import pynvml" 2>/dev/null || fail "nvidia-ml-py is not installed: pip install -e '.[gpu]'"

out=$(mktemp)
started=$(date -u '+%Y-%m-%d %H:%M')
timeout --kill-after=10 "$LIMIT" $python scripts/gpu_check.py "$@" | tee "$out"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "gpu-check: ERROR the whole run passed ${LIMIT} s" | tee -a "$out"
lines=$(grep '^gpu-check' "$out" || true)
[ -n "$lines" ] || lines="gpu-check: no check printed a line (exit $status)"
{
  echo
  echo "## GPU check ($started UTC, $(echo "$gpus" | head -1), torch $($python -c 'import torch; print(torch.__version__)'))"
  echo
  echo "\`bash scripts/gpu-check.sh $*\` (exit $status)"
  echo
  echo "$lines" | sed 's/^/- /'
} >> benchmarks/HISTORY.md
rm -f "$out"
echo "gpu-check: results appended to benchmarks/HISTORY.md"
exit "$status"
