#!/usr/bin/env bash
# The device checks for a lent GPU machine, prepared as one run of under 10 minutes: first the open issues' GPU
# figures (49 item 6: the folder recipe on one GPU; 50: the GPU distillation presets), then issue 52's speed parts.
#
# Run from the repository root on the device machine, with the Fashion-MNIST IDX files carried in .gpu/:
#   here, once:   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu; cp -r /usr/share/datasets/fashion-mnist .gpu/
#                 .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .gpu/whl webdataset braceexpand
#                 (the device image has torch, Lightning, timm, but not webdataset, which the e2e shards arm needs)
#   first call:   run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=600)
#                 runs distill, folder, step (limits 100 + 270 + 170 = 540 s, plus ~10 s of start)
#   second call:  run(command="bash benchmarks/gpu_session.sh e2e mfu decode methods", carry=[".gpu"], timeout_s=600)
#                 (limits 210 + 80 + 45 + 95 = 430 s; issue 52's parts, whose figures are optional now)
#   third call:   run(command="bash benchmarks/gpu_session.sh gram", timeout_s=600)
#                 (limit 450 s; issue 65 part 3: the Gram-anchoring claim's arms, three seeds side by side)
#   a dry run here (every part on the CPU at toy size, or those named; tests/test_gpu_session.py runs it in two groups):
#                 OUT=/tmp/gpu_dry bash benchmarks/gpu_session.sh --dry-run [PART ...]
# What comes back: $OUT/gpu_session.tar.gz (every part's JSON and log, re-packed after each part, so a run stopped by
# its limit keeps the parts it finished; the device returns at most 8 files), $OUT/parts.txt (each part's exit code
# and seconds) and $OUT/gpu.txt (the machine). Unpack the JSONs into benchmarks/results/ and commit them.
# Parts (the default: distill folder step, in this order; name some to run only those: `... gpu_session.sh step`):
# 1. distill (issue 50; benchmarks/distill_presets.py): distill-dinov2-vits14-r18-imagefolder and
#    distill-dinov2-vits14-vits-imagefolder, 12 steps each (batch 256, 224 px, bf16) on 3,072 synthetic JPEGs, the
#    teacher a file in DINOv2's hub layout (dinov2_vits14_pretrain.pth's keys and shapes, 518-px pos_embed) with
#    random values written on the device (no network; the real 88 MB file is over the 64 MiB carry): the teacher's
#    dtype, device and mode, its position table resampled, the step time, the teacher's forward alone, the peak GPU
#    memory, the losses finite, the teacher's sha256 in run.json (distill_presets_gpu.json).       at most 100 s
# 2. folder (issue 49 item 6; benchmarks/folder_recipe.py): selfsup.pretrain(method, data.root=FOLDER, trainer.seed=S)
#    with the recipe's own values on the GPU (it resolves the accelerator, grid and sizes itself) for simclr, mae and
#    dinov2 on 2,000 Fashion-MNIST PNGs written on the device: six processes side by side, two per method (seeds 0
#    then 2, and seed 1), so seeds 0 and 1 come first; a run the limit cuts is left out, and the JSON's rows say
#    which seeds finished. Per run: the resolved recipe, fit seconds, steps, kNN@20 gain over its init
#    (folder_recipe_gpu.json; each method's printed recipe block in folder.log).                    at most 270 s
# 3. step (issue 52 item 3; benchmarks/gpu_step.py): MoCo v3 and DINO ViT-S/16 at 224 px, bf16, fused AdamW:
#    the torch profiler's top kernels, idle gaps and host syncs of one step (profile_*.json); step time and MFU at
#    batch 128 and doubling to the largest that fits (sweep_*.json); the SDPA kernel taken (sdpa.json); the step
#    that crosses an epoch end, and the checkpoint writes, timed apart (epoch_end.json).           at most 170 s
# 4. e2e (issue 52 item 2; benchmarks/end_to_end.py): DINO ViT-S/16 (2 x 224 + 8 x 96, batch 128) through the engine
#    from synthetic JPEGs: data.decode=device (the next batch decoded on a side stream during the step) and
#    data.decode=cpu with 14 workers against the step with free data (end_to_end_cuda.json), then the CPU path with
#    2 workers (end_to_end_cuda_2workers.json): data.decode=auto's rule (runs.data.DEVICE_DECODE_BELOW_WORKERS).
#    Goal: device >= 0.9 of step-only.                                                             at most 210 s
# 5. mfu (benchmarks/mfu.py --device cuda): MoCo v3 ViT-S/16 eager beside compiled, alternating (mfu_cuda.json).
#                                                                                                   at most 80 s
# 6. decode (benchmarks/decode.py --sizes realistic --device cuda): the workers' CPU cost per image beside
#    torchvision's on the same files, nvJPEG's batched decode + crops (decode_realistic_cuda.json). at most 45 s
# 7. methods (issue 24 item 6): benchmarks/methods_fmnist.py, 5 short Fashion-MNIST epochs (40 steps each) at seed 0,
#    three processes side by side on the GPU (methods_fmnist_5ep_short.json and its table).        at most 95 s
# 8. gram (issue 65 part 3; benchmarks/gram_anchoring.py): the claim gram-anchoring-keeps-dense-features at the
#    budget its CPU form cannot reach: dinov3-fmnist with and without its Gram term for 30 epochs (7,020 steps at
#    batch 256; the Gram teacher from epoch 21, refreshed at 24 and 27), seeds 0, 1, 2 side by side (each process
#    both arms of its seed), kNN and (once selfsup eval segment is merged) the dense mIoU of each, the claim's rules
#    judged on the seeds that finished (gram_anchoring_30ep.json).                                  at most 450 s
# Each part has its own time limit, so a slow one cannot eat the next's.
set -uo pipefail
DRY=0
PARTS=()
for arg in "$@"; do
    if [[ "$arg" == "--dry-run" ]]; then DRY=1; else PARTS+=("$arg"); fi
done
if [[ ${#PARTS[@]} -eq 0 ]]; then  # the first call's parts; a dry run checks them all
    if [[ $DRY == 1 ]]; then PARTS=(distill folder step e2e mfu decode methods); else PARTS=(distill folder step); fi
fi
OUT=${OUT:-/tmp/gpu_out}
W=$(mktemp -d /tmp/gpu_work.XXXXXX)  # the per-process files and runs; only the results come back
R=$W/results                        # the results, packed into $OUT/gpu_session.tar.gz after each part
mkdir -p "$OUT" "$R"
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[[ -d .gpu/fashion-mnist ]] && export SELFSUP_FASHION_MNIST_DIR=$PWD/.gpu/fashion-mnist
PY=${PYTHON:-python3}
if [[ $DRY == 0 ]] && compgen -G ".gpu/whl/*.whl" > /dev/null; then  # the carried wheels (webdataset: shards)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
has() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }
# the time limit of a part: its GPU figure, or 240 s for its toy run on a CPU
limit() { if [[ $DRY == 1 ]]; then echo 240; else echo "$1"; fi; }
{
    if [[ $DRY == 1 ]]; then echo "dry run: every part on the CPU at toy size"; else
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
    $PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"
    nproc | sed 's/^/cpu cores: /'
    echo "parts: ${PARTS[*]}"
} 2>&1 | tee "$OUT/gpu.txt"
status=0
pack() {  # every result so far into $OUT/gpu_session.tar.gz, whole or not at all (a temporary file, then a rename)
    cp "$OUT/gpu.txt" "$OUT/parts.txt" "$R/" 2> /dev/null
    tar -czf "$OUT/gpu_session.tar.gz.tmp" -C "$R" . && mv "$OUT/gpu_session.tar.gz.tmp" "$OUT/gpu_session.tar.gz"
}
part() {  # part NAME SECONDS COMMAND...: run it with its limit, its log in $R/NAME.log, note a failure, pack
    local name=$1 seconds=$2
    shift 2
    local t0=$SECONDS
    timeout -k 10 "$(limit "$seconds")" "$@" > "$R/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
    tail -n 5 "$R/$name.log"
    [[ $rc == 0 ]] || status=1
    pack
}

if has distill; then
    dry=(); [[ $DRY == 1 ]] && dry=(--dry-run)
    part distill 100 $PY -m benchmarks.distill_presets "${dry[@]}" --work "$W/distill" \
        --out "$R/distill_presets_gpu.json"
fi

if has folder; then
    t0=$SECONDS
    budget=$(limit 270)
    if [[ $DRY == 1 ]]; then  # 100 images, 10 a class in val/, 2 steps a run, two lanes, the GPU's recipe on the CPU
        fr=(--sizes 100 --val-per-class 10 --set trainer.max_steps=2 --as-gpu "dry-run GPU")
        lanes=("simclr,mae|0" "dinov2|0")
    else  # METHODS|SEEDS a process: seeds 0 and 1 of every method first
        fr=(--sizes 2000)
        lanes=("simclr|0,2" "simclr|1" "mae|0,2" "mae|1" "dinov2|0,2" "dinov2|1")
    fi
    fr+=(--data "$W/folder" --runs "$W/folder_runs" --side-by-side ${#lanes[@]})
    rc=0
    timeout 60 $PY -m benchmarks.folder_recipe "${fr[@]}" --write-only > "$R/folder.log" 2>&1 || rc=1
    left=$((budget - (SECONDS - t0) - 15))  # 15 s for the combining
    pids=()
    for i in "${!lanes[@]}"; do
        timeout -k 10 "$left" $PY -m benchmarks.folder_recipe "${fr[@]}" --methods "${lanes[$i]%|*}" \
            --seeds "${lanes[$i]#*|}" --out "$W/folder_lane$i.json" > "$W/folder_lane$i.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for i in "${!lanes[@]}"; do  # each lane's recipe blocks, results and errors (not the per-step chatter)
        echo "== lane $i: ${lanes[$i]}"
        grep -v -e "^Epoch" -e "it/s]" "$W/folder_lane$i.log" | tail -n 60
    done >> "$R/folder.log"
    $PY -m benchmarks.folder_recipe --combine "$W"/folder_lane*.json --side-by-side ${#lanes[@]} \
        --out "$R/folder_recipe_gpu.json" >> "$R/folder.log" 2>&1 || rc=1
    echo "folder: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
    tail -n 4 "$R/folder.log"
    [[ $rc == 0 ]] || status=1
    pack
fi

if has step; then
    dry=(); [[ $DRY == 1 ]] && dry=(--dry-run)
    part step 170 $PY -m benchmarks.gpu_step "${dry[@]}" --out-dir "$R"
fi

if has e2e; then
    if [[ $DRY == 1 ]]; then
        toy=(data.image_size=32 augment.local_crops_size=16 augment.local_crops_number=2 model.backbone=vit_micro
             model.patch_size=8 method.out_dim=256 method.hidden_dim=64 method.bottleneck_dim=32
             trainer.precision=32-true)
        e2e=(--images 12 --batch-size 4 --workers 0 --steps 2 --warmup 1)
        for o in "${toy[@]}"; do e2e+=(--set "$o"); done
        e2e2=("${e2e[@]}")
    else
        workers=$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))
        # 4,096 images = 32 steps an epoch, so the 30 timed and warm-up steps stay inside one epoch
        e2e=(--images 4096 --batch-size 128 --workers "$workers" --steps 24 --warmup 6)
        e2e2=(--images 2048 --batch-size 128 --workers 2 --steps 10 --warmup 4)
    fi
    part e2e 140 $PY -m benchmarks.end_to_end "${e2e[@]}" --arms step_only,device,cpu --out "$R/end_to_end_cuda.json"
    part e2e_2workers 70 $PY -m benchmarks.end_to_end "${e2e2[@]}" --arms cpu \
        --out "$R/end_to_end_cuda_2workers.json"
fi

if has mfu; then
    if [[ $DRY == 1 ]]; then
        part mfu 100 $PY -m benchmarks.mfu --quick --device cpu --methods moco_v3 --heads preset --no-lightly \
            --out "$R/mfu_cuda.json"
    else
        part mfu 80 $PY -m benchmarks.mfu --device cuda --methods moco_v3 --reps 2 --no-lightly \
            --out "$R/mfu_cuda.json"
    fi
fi

if has decode; then
    if [[ $DRY == 1 ]]; then
        part decode 60 $PY -m benchmarks.decode --sizes realistic --quick --device cpu \
            --out "$R/decode_realistic_cuda.json"
    else
        part decode 45 $PY -m benchmarks.decode --sizes realistic --device cuda --images 64 --repeat 3 \
            --out "$R/decode_realistic_cuda.json"
    fi
fi

if has methods; then
    groups=("simclr-fmnist,byol-fmnist,simsiam-fmnist,moco-v3-vit-fmnist,barlow-twins-fmnist"
            "vicreg-fmnist,dino-fmnist,ibot-fmnist,mae-fmnist"
            "swav-fmnist,wmse-fmnist,nnclr-fmnist")
    if [[ $DRY == 1 ]]; then
        groups=("simclr-fmnist")
        budget=(--quick --accelerator cpu)
    else
        budget=(--epochs 5 --steps-per-epoch 40 --eval-train 5000 --probe-epochs 10 --ft-epochs 1 --accelerator gpu)
    fi
    t0=$SECONDS
    pids=()
    for g in "${!groups[@]}"; do  # the groups side by side (the micro ViT leaves the GPU idle)
        timeout -k 10 "$(limit 95)" $PY -m benchmarks.methods_fmnist "${budget[@]}" --seeds 0 --presets "${groups[$g]}" \
            --runs "$W/runs" --out "$W/methods_g$g.json" > "$W/methods_g$g.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    $PY -m benchmarks.methods_fmnist --combine "$W"/methods_g*.json --out "$R/methods_fmnist_5ep_short.json" \
        > "$R/methods_table.md" 2>&1 || rc=1
    tail -n 2 "$W"/methods_g*.log > "$R/methods.log"
    echo "methods: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
    [[ $rc == 0 ]] || status=1
    pack
fi
if has gram; then
    if [[ $DRY == 1 ]]; then gram=(--quick --epochs 1 --accelerator cpu); lanes=(0); else
        gram=(--epochs 30 --accelerator gpu); lanes=(0 1 2); fi
    t0=$SECONDS
    pids=()
    for s in "${lanes[@]}"; do  # a seed a process (the micro ViT leaves the GPU idle)
        timeout -k 10 "$(limit 430)" $PY -m benchmarks.gram_anchoring "${gram[@]}" --seeds "$s" --work "$W/gram" \
            --out "$W/gram_s$s.json" > "$W/gram_s$s.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    $PY -m benchmarks.gram_anchoring --combine "$W"/gram_s*.json --out "$R/gram_anchoring_30ep.json" \
        > "$R/gram.log" 2>&1 || rc=1
    tail -n 3 "$W"/gram_s*.log >> "$R/gram.log"
    echo "gram: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
    tail -n 2 "$R/gram.log"
    [[ $rc == 0 ]] || status=1
    pack
fi
pack
rm -rf "$W"
exit $status
