#!/usr/bin/env bash
# The device checks for a lent GPU machine, prepared as one short script (issues 24 and 25).
#
# Run from the repository root on the device machine, with the Fashion-MNIST IDX files carried in .gpu/:
#   here, once:   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu; cp -r /usr/share/datasets/fashion-mnist .gpu/
#   device tool:  run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=560)
# Everything it writes lands in $OUT (the tool brings it back, 8 files): copy the JSONs and the PNG to
# benchmarks/results/ and commit.
#
# 1. benchmarks/mfu.py --device cuda: MoCo v3 ViT-S/16 at 224 px, bf16 autocast, fused AdamW, eager beside the
#    compiled step, alternating (issue 25 item 4). lightly's peer step only where lightly is importable there.
# 2. benchmarks/methods_fmnist.py at 5 whole Fashion-MNIST epochs x 3 seeds on the GPU (issue 24 item 6), in
#    processes side by side, then one JSON and its table (a row is written as soon as it is measured).
# Each part has its own time limit, so a slow first part cannot eat the second's.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
W=/tmp/gpu_work  # the per-process files and runs; only the 8 results come back (the tool returns 8 files at most)
mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 SELFSUP_FASHION_MNIST_DIR=$PWD/.gpu/fashion-mnist
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a "$OUT/gpu.txt"

peer=--no-lightly
$PY -c "import lightly" 2>/dev/null && peer=
timeout 200 $PY benchmarks/mfu.py --device cuda --methods moco_v3 --reps 3 $peer --out "$OUT/mfu_cuda.json" \
    2>&1 | tail -n 40 | tee "$OUT/mfu_cuda.log"

# 3 seeds x 3 groups of presets = 9 processes side by side (16 CPU cores there; the micro ViT leaves the GPU idle)
groups=("simclr-fmnist,byol-fmnist,simsiam-fmnist,moco-v3-vit-fmnist,barlow-twins-fmnist"
        "vicreg-fmnist,dino-fmnist,ibot-fmnist,mae-fmnist"
        "swav-fmnist,wmse-fmnist,nnclr-fmnist")
pids=()
for seed in 0 1 2; do
    for g in 0 1 2; do
        timeout 330 $PY benchmarks/methods_fmnist.py --epochs 5 --steps-per-epoch 0 --seeds $seed --accelerator gpu \
            --presets "${groups[$g]}" --instruments --runs "$W/runs" \
            --out "$W/methods_s${seed}_g$g.json" > "$W/methods_s${seed}_g$g.log" 2>&1 &
        pids+=($!)
    done
done
wait "${pids[@]}"
$PY benchmarks/methods_fmnist.py --combine "$W"/methods_s*_g*.json --out "$OUT/methods_fmnist_5ep.json" \
    | tee "$OUT/methods_table.md"
tail -n 2 "$W"/methods_s*_g*.log | tee "$OUT/methods.log"
# DINO's collapse signs over its 5 epochs, seed 0 (issue 24 item 6): 2 more files, 8 in all
$PY benchmarks/dino_curves.py "$W/runs/dino-fmnist-s0" --out "$OUT/dino_fmnist_5ep_curves" | tail -n 7
