#!/bin/bash
# The GPU acceptance run, as one command on a lent machine (its python3 holds torch with CUDA; nothing can be fetched
# there): install the carried wheels (benchmarks/device_wheels.sh, run here first), then every bench_cuda case, each in
# a process of its own, writing under $OUT what comes back: log.txt (every line), rows.json (rewritten as each case
# ends, so a stopped run keeps its rows), env.txt, graphs.tgz (the captured Graphs). The whole run stops after
# ${DEVICE_SECONDS:-530} s, inside one device call of 600 s.
#
#   run(command="bash benchmarks/device_acceptance.sh", carry=[".whl"], timeout_s=600)
#
# Extra arguments go to bench_cuda.py (e.g. `--only gpt2/compile/0.5 resnet/compile/0.5`).
set -u -o pipefail
OUT=${OUT:?OUT is where the device tool collects the files}
PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "device_acceptance: the carried wheels did not install"; exit 2; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    $PYTHON -c "import torch, ortools, pulp, pydantic, transformers; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'ortools', ortools.__version__, 'pulp', pulp.__version__, 'pydantic', pydantic.VERSION, \
'transformers', transformers.__version__)" 2>&1
    git log --oneline -1 2>/dev/null
} > "$OUT/env.txt"
mkdir -p /tmp/coop-graphs
timeout "${DEVICE_SECONDS:-530}" $PYTHON benchmarks/bench_cuda.py --jobs "${DEVICE_JOBS:-8}" --time-limit 10 \
    --case-timeout 300 --json "$OUT/rows.json" --save-graphs /tmp/coop-graphs "$@" 2>&1 | tee "$OUT/log.txt"
status=$?
tar czf "$OUT/graphs.tgz" -C /tmp/coop-graphs . 2>/dev/null  # the captured Graphs, and records/: each planned
# row's Graph, schedule and the CUDA allocator's trace and segments of its warm step (issue 43)
exit $status
