#!/usr/bin/env bash
# GPU throughput check: gpt2_124m (GPT-2 BPE), bf16 + torch.compile, ~50 steps per architecture,
# then a table of tokens/s, step time, MFU and peak memory per arch, read from each run's summary.json.
#
#   bash scripts/gpu_check.sh                       # every arch, one GPU, under 10 minutes on an H100/H200
#   ARCHS="pre_ln ngpt" STEPS=30 bash scripts/gpu_check.sh
#   NPROC=8 bash scripts/gpu_check.sh               # DDP over 8 GPUs (torchrun), same global batch
#
# Knobs (environment): ARCHS, STEPS (50), BATCH (micro-batch, 32), ACCUM (grad accumulation, 2),
# NPROC (1), BUDGET_S (total time budget, 540: archs that would not fit are skipped and
# reported), RUN_TIMEOUT_S (per run, 300), OUT (output dir), PYTHON, PEAK_FLOPS (override the
# peak table: needed for GPUs other than A100/H100/H200), EXTRA (more Hydra overrides).
# Exit status: 0 all runs completed, 1 a run failed, 2 no usable GPU / setup error.
# MFU = (6N + 12 L d T) x tokens/s / (peak bf16 FLOP/s x GPUs), see src/normbench/flops.py.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
ARCHS=${ARCHS:-"pre_ln ngpt post_ln peri_ln mix_ln hybridnorm hybridnorm_star deepnorm"}
STEPS=${STEPS:-50}
BATCH=${BATCH:-32}
ACCUM=${ACCUM:-2}
NPROC=${NPROC:-1}
BUDGET_S=${BUDGET_S:-540}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-300}
OUT=${OUT:-outputs/gpu_check/$(date +%Y%m%d-%H%M%S)}
EXTRA=${EXTRA:-}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}

die() { echo "gpu_check: error: $*" >&2; exit 2; }

# ---- fail fast: a CUDA GPU, torch built with CUDA, normbench importable
info=$("$PYTHON" - "$NPROC" <<'EOF' 2>&1
import sys
try:
    import torch
    import normbench  # noqa: F401
except Exception as exc:  # noqa: BLE001
    sys.exit(f"cannot import torch/normbench with this Python ({exc})")
if not torch.cuda.is_available():
    sys.exit(f"no CUDA GPU visible (torch {torch.__version__}, built for CUDA: {torch.version.cuda}); "
             "this check needs one (see scripts/bench_throughput.py for the CPU case)")
need = int(sys.argv[1])
if torch.cuda.device_count() < need:
    sys.exit(f"NPROC={need} but only {torch.cuda.device_count()} GPU(s) visible")
from normbench.flops import gpu_peak_flops
name = torch.cuda.get_device_name(0)
peak = gpu_peak_flops(name)
print(f"{name} | torch {torch.__version__} | CUDA {torch.version.cuda} | bf16 peak "
      f"{'%.0f TFLOP/s' % (peak / 1e12) if peak else 'unknown (set PEAK_FLOPS=)'} | bf16 ok: {torch.cuda.is_bf16_supported()}")
EOF
) || die "$info"
echo "gpu_check: $info"
[ "$(( ACCUM % NPROC ))" -eq 0 ] || die "ACCUM=$ACCUM must be a multiple of NPROC=$NPROC"

mkdir -p "$OUT" || die "cannot create $OUT"
echo "gpu_check: gpt2_124m, ${STEPS} steps/arch, micro-batch ${BATCH} x accum ${ACCUM} x 1024 tokens, bf16, compile, ${NPROC} GPU(s) -> $OUT"

launcher=("$PYTHON" -m normbench)
parallel=none
if [ "$NPROC" -gt 1 ]; then
    launcher=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" -m normbench)
    parallel=ddp
fi
peak=()
[ -n "${PEAK_FLOPS:-}" ] && peak=("peak_flops=$PEAK_FLOPS")

start=$(date +%s)
slowest=0
failed=0
ran=()
skipped=()
first=1
for arch in $ARCHS; do
    now=$(date +%s)
    elapsed=$(( now - start ))
    if [ "$first" -eq 0 ] && [ $(( elapsed + slowest )) -gt "$BUDGET_S" ]; then
        skipped+=("$arch")
        continue
    fi
    run_dir="$OUT/$arch"
    echo "gpu_check: [$arch] training ... (log: $run_dir.log)"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout --signal=TERM --kill-after=30 "$RUN_TIMEOUT_S" "${launcher[@]}" train \
        model=gpt2_124m data.tokenizer=gpt2 arch="$arch" \
        precision=bf16 compile=true device=cuda parallel="$parallel" diag=off \
        trainer.batch_size="$BATCH" trainer.grad_accum="$ACCUM" trainer.max_steps="$STEPS" \
        trainer.log_every=10 trainer.eval_every=100000 trainer.eval_batches=1 trainer.ckpt_every=100000 \
        sched.warmup_steps=5 "${peak[@]}" $EXTRA hydra.run.dir="$run_dir" >"$run_dir.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - t0 ))
    [ "$took" -gt "$slowest" ] && slowest=$took
    ran+=("$arch")
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "gpu_check: [$arch] FAILED (exit $rc after ${took}s); last lines of $run_dir.log:" >&2
        tail -n 15 "$run_dir.log" >&2
        if [ "$first" -eq 1 ]; then
            echo "gpu_check: the first run failed: stopping here (fix the setup, then rerun)" >&2
            break
        fi
    else
        echo "gpu_check: [$arch] done in ${took}s"
    fi
    first=0
done

# ---- the table, from each run's summary.json
"$PYTHON" - "$OUT" "${ran[@]}" <<'EOF'
import json, sys
from pathlib import Path

out, archs = Path(sys.argv[1]), sys.argv[2:]
fmt = "{:<16} {:>10} {:>12} {:>10} {:>7} {:>10} {:>10}"
print()
print(fmt.format("arch", "status", "tokens/s", "step (s)", "MFU", "mem (GB)", "loss"))
print("-" * 81)
bad = False
for arch in archs:
    path = out / arch / "summary.json"
    s = json.loads(path.read_text()) if path.exists() else {"status": "no summary"}
    def f(key, spec):
        v = s.get(key)
        return "-" if v is None else format(v, spec)
    mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
    print(fmt.format(arch, str(s.get("status")), f("tokens_per_s", ",.0f"), f("step_time_s", ".3f"), mfu,
                     f("peak_mem_gb", ".1f"), f("final_loss", ".3f")))
    bad |= s.get("status") != "completed"
    if arch == "pre_ln" and s.get("mfu") is not None:
        verdict = "met" if s["mfu"] >= 0.40 else "NOT met"
        target_line = f"target MFU >= 40% for pre_ln: {verdict} ({100 * s['mfu']:.1f}%)"
        print(target_line, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
table_rc=$?
[ "${#skipped[@]}" -gt 0 ] && echo "gpu_check: skipped to stay within BUDGET_S=${BUDGET_S}s: ${skipped[*]} (rerun with ARCHS=...)"
echo "gpu_check: total $(( $(date +%s) - start ))s; runs in $OUT"
if [ "$failed" -ne 0 ] || [ "$table_rc" -ne 0 ]; then
    exit 1
fi
exit 0
