#!/usr/bin/env bash
# The device checks for a lent GPU machine, prepared as one short script per call (issues 24, 25 and 39).
#
# Run from the repository root on the device machine, with the Fashion-MNIST IDX files carried in .gpu/:
#   here, once:   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu; cp -r /usr/share/datasets/fashion-mnist .gpu/
#                 .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .gpu/whl webdataset braceexpand
#                 (the device image has torch, Lightning, timm, but not webdataset, which the shards arm needs)
#   device tool:  run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=600)
#   then, when the device time left allows a second call:
#                 run(command="bash benchmarks/gpu_session.sh methods", carry=[".gpu"], timeout_s=420)
# Everything it writes lands in $OUT (the tool brings it back): copy the JSONs to benchmarks/results/ and commit.
#
# Part "data" (the default; issue 39 item 4 and issue 25 item 4), about 9 minutes with a machine's start (run
# 2026-12-04: 3 + 5 minutes):
# 1. benchmarks/mfu.py --device cuda: MoCo v3 ViT-S/16 at 224 px, bf16 autocast, fused AdamW, eager beside the
#    compiled step, alternating. lightly's peer step only where lightly is importable there.
# 2. benchmarks/decode.py --sizes realistic --device cuda: the workers' CPU cost per image of each path beside
#    torchvision's, and data.decode=device's batched nvJPEG decode + crops in images/s on the GPU.
# 3. benchmarks/end_to_end.py: DINO ViT-S/16 (2 x 224 + 8 x 96, batch 128, bf16) through the engine from synthetic
#    JPEGs (data.decode=device; data.decode=cpu; shards) against the step with free data. Goal: >= 90% of it.
# Part "methods" (issue 24 item 6): benchmarks/methods_fmnist.py at 5 whole Fashion-MNIST epochs x 3 seeds on the
#    GPU, in processes side by side, then one JSON and its table, and DINO's 5-epoch curves.
# Each step has its own time limit, so a slow one cannot eat the next's.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
W=/tmp/gpu_work  # the per-process files and runs; only the results come back
mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 SELFSUP_FASHION_MNIST_DIR=$PWD/.gpu/fashion-mnist
PY=${PYTHON:-python3}
if compgen -G ".gpu/whl/*.whl" > /dev/null; then  # the carried wheels (webdataset for the shards arm)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
PARTS=${*:-data}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a "$OUT/gpu.txt"
nproc | sed 's/^/cpu cores: /' | tee -a "$OUT/gpu.txt"

if [[ " $PARTS " == *" data "* ]]; then
    peer=--no-lightly
    $PY -c "import lightly" 2>/dev/null && peer=
    timeout 170 $PY -m benchmarks.mfu --device cuda --methods moco_v3 --reps 3 $peer --out "$OUT/mfu_cuda.json" \
        2>&1 | tail -n 40 | tee "$OUT/mfu_cuda.log"
    timeout 90 $PY -m benchmarks.decode --sizes realistic --device cuda --images 128 --repeat 3 \
        --out "$OUT/decode_realistic_cuda.json" 2>&1 | tail -n 40 | tee "$OUT/decode_cuda.log"
    workers=$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))
    # 6,144 images = 48 steps an epoch, so the 60 timed steps cross one epoch end (its step_ms shows where)
    timeout 330 $PY -m benchmarks.end_to_end --images 6144 --batch-size 128 --workers "$workers" --steps 60 \
        --warmup 10 --out "$OUT/end_to_end_cuda.json" 2>&1 | grep -v -i warn | tail -n 20 | tee "$OUT/end_to_end.log"
fi

if [[ " $PARTS " == *" methods "* ]]; then
    # 3 seeds x 3 groups of presets = 9 processes side by side (the micro ViT leaves the GPU idle)
    groups=("simclr-fmnist,byol-fmnist,simsiam-fmnist,moco-v3-vit-fmnist,barlow-twins-fmnist"
            "vicreg-fmnist,dino-fmnist,ibot-fmnist,mae-fmnist"
            "swav-fmnist,wmse-vit-fmnist,nnclr-fmnist")
    pids=()
    for seed in 0 1 2; do
        for g in 0 1 2; do
            timeout 330 $PY -m benchmarks.methods_fmnist --epochs 5 --steps-per-epoch 0 --seeds $seed \
                --accelerator gpu --presets "${groups[$g]}" --instruments --runs "$W/runs" \
                --out "$W/methods_s${seed}_g$g.json" > "$W/methods_s${seed}_g$g.log" 2>&1 &
            pids+=($!)
        done
    done
    wait "${pids[@]}"
    $PY -m benchmarks.methods_fmnist --combine "$W"/methods_s*_g*.json --out "$OUT/methods_fmnist_5ep.json" \
        | tee "$OUT/methods_table.md"
    tail -n 2 "$W"/methods_s*_g*.log | tee "$OUT/methods.log"
    $PY -m benchmarks.dino_curves "$W/runs/dino-fmnist-s0" --out "$OUT/dino_fmnist_5ep_curves" | tail -n 7
fi
