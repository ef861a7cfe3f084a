#!/usr/bin/env bash
# Smoke test of the Kubernetes engine on a REAL cluster (your current kubectl context).
# NOT RUN by the project's tests or CI: no API server can run on the machines they use.
#
#   NAMESPACE=ml IMAGE=ghcr.io/me/jupyter-dlc:latest scripts/k8s-smoke.sh
#
# IMAGE must hold torch and jupyter-dlc (it runs both the launcher and the ranks); the
# namespace needs a storage class that serves ReadWriteMany (the PVC). What it does:
#   1. deploys the launcher in NAMESPACE (`jupyter-dlc launcher manifest`) and its token Secret;
#   2. port-forwards to it and runs, through it, an env-contract job (2 nodes x 2 processes)
#      that prints what each rank got (RANK, WORLD_SIZE, MASTER_ADDR, PET_*, DLC_*);
#   3. runs a checkpointing job, deletes one of its pods mid-run, and checks the launcher
#      restarts it from the newest committed checkpoint (resume step > 0);
#   4. prints what it saw, and leaves the launcher running (`kubectl delete -f` the printed
#      manifest file to remove it).
set -euo pipefail
NAMESPACE="${NAMESPACE:-default}"
IMAGE="${IMAGE:?set IMAGE to an image with torch and jupyter-dlc}"
KIND="${KIND:-}"   # TrainJob | PyTorchJob | Job; empty: what the cluster serves
WORK="$(mktemp -d)"
PF_PID=""
cleanup() { [ -n "$PF_PID" ] && kill "$PF_PID" 2>/dev/null || true; }
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }

say "context $(kubectl config current-context), namespace $NAMESPACE"
kubectl get namespace "$NAMESPACE" >/dev/null
if ! kubectl -n "$NAMESPACE" get secret jupyter-dlc-token >/dev/null 2>&1; then
    kubectl -n "$NAMESPACE" create secret generic jupyter-dlc-token \
        --from-literal=token="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
fi
jupyter-dlc launcher manifest --namespace "$NAMESPACE" --image "$IMAGE" > "$WORK/launcher.yaml"
kubectl apply -f "$WORK/launcher.yaml"
kubectl -n "$NAMESPACE" rollout status deployment/jupyter-dlc --timeout=300s
kubectl -n "$NAMESPACE" port-forward svc/jupyter-dlc 18787:8787 >"$WORK/pf.log" 2>&1 &
PF_PID=$!
export DLC_LAUNCHER_URL=http://127.0.0.1:18787
DLC_LAUNCHER_TOKEN="$(kubectl -n "$NAMESPACE" get secret jupyter-dlc-token -o jsonpath='{.data.token}' | base64 -d)"
export DLC_LAUNCHER_TOKEN
for _ in $(seq 50); do curl -fsS -H "Authorization: token $DLC_LAUNCHER_TOKEN" "$DLC_LAUNCHER_URL/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
if [ -n "$KIND" ]; then
    echo "note: KIND=$KIND applies to the in-cluster profile only if you add kind: $KIND to its ConfigMap"
fi

say "env-contract job (2 nodes x 2 processes)"
cat > "$WORK/env_check.py" <<'PY'
import os
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK",
        "DLC_JOB_ID", "DLC_ATTEMPT", "DLC_NODE_RANK", "DLC_CHECKPOINT_DIR", "DLC_LAUNCHER_URL"]
print(" ".join(f"{k}={os.environ.get(k)}" for k in keys), "DLC_TOKEN set:", bool(os.environ.get("DLC_TOKEN")))
PY
env_job="$(jupyter-dlc run "$WORK/env_check.py" --cluster in-cluster --nodes 2 --nproc-per-node 2 --wait | tail -n1)"
echo "$env_job"
jupyter-dlc list | tail -n 3
job_id="$(jupyter-dlc list | awk 'NR>1 {print $1}' | tail -n1)"
jupyter-dlc logs "$job_id" || true

say "kill-and-resume job"
cat > "$WORK/resume_check.py" <<'PY'
import os, time
import torch
from jupyter_dlc import runtime
runtime.init()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = runtime.Checkpointer(model=model, optimizer=opt)
step = ckpt.restore()
print(f"attempt {os.environ.get('DLC_ATTEMPT')} starts after step {step}", flush=True)
while step < 60:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
    runtime.log(step, loss=loss.item())
    if step % 10 == 0:
        ckpt.save(step)
    time.sleep(1)
PY
jupyter-dlc run "$WORK/resume_check.py" --cluster in-cluster --nodes 2 --nproc-per-node 1 --max-restarts 2
job_id="$(jupyter-dlc list | awk 'NR>1 {print $1}' | tail -n1)"
echo "waiting for a committed checkpoint of $job_id"
until jupyter-dlc checkpoints "$job_id" | grep -q '^ *[1-9]'; do sleep 5; done
victim="$(kubectl -n "$NAMESPACE" get pods -l "dlc.jupyter.org/job-id=$job_id,dlc.jupyter.org/attempt=1" -o name | tail -n1)"
say "deleting $victim"
kubectl -n "$NAMESPACE" delete "$victim" --wait=false
until jupyter-dlc status "$job_id" | grep -qE 'SUCCEEDED|FAILED|STOPPED|CANCELLED'; do sleep 5; done

say "what it saw"
jupyter-dlc status "$job_id" || true
jupyter-dlc logs "$job_id" | grep -E "starts after step" || echo "no resume line found"
kubectl -n "$NAMESPACE" get trainjobs,pytorchjobs,jobs -l "dlc.jupyter.org/job-id=$job_id" 2>/dev/null || true
echo "launcher manifest: $WORK/launcher.yaml"
