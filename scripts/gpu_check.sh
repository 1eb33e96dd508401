#!/usr/bin/env bash
# GPU check, one command on a fresh CUDA machine: gpt2_124m (GPT-2 BPE), bf16 + flash attention, every
# architecture in normbench's registry, then a table of tokens/s, MFU, peak memory (and its ratio to pre_ln
# and to normbench.runtime.memory's estimate) and the set-up/compile time per arch, read from each run's
# summary.json, written into docs/performance.md's GPU section (DOC=, WRITE_DOC=0 to leave it). One compiled
# pre_ln run (STEPS steps, the MFU target) and one eager pre_ln run (the compile speed-up, the numbers
# compile=auto needs, normbench/runtime/compiling.py, and the reference of the eager sweep); a short
# `scale=gpu` run of one claim (reproduce's sweep, measure and verdict end to end on CUDA); with 2+ GPUs a
# DDP 2-process smoke run; then the other archs eager (compiling costs 35-60 s per arch, more than a whole
# eager run), at as many steps as the budget plan fits (SWEEP_STEPS). Order: pre_ln, the eager pre_ln, the
# claim, (DDP,) then the other archs while BUDGET_S lasts (measured times decide).
#
#   bash scripts/gpu_check.sh                       # everything, one GPU (budget plan printed first)
#   WHEELS=DIR bash scripts/gpu_check.sh            # an air-gapped node: install offline from a wheelhouse
#   ARCHS="pre_ln ngpt" STEPS=30 bash scripts/gpu_check.sh
#   NPROC=8 bash scripts/gpu_check.sh               # the arch runs with DDP over 8 GPUs (torchrun)
#   DRY_RUN=1 bash scripts/gpu_check.sh             # print the setup, the budget plan and the commands, no GPU needed
#   TABLE_ONLY=1 OUT=outputs/gpu_check/X bash scripts/gpu_check.sh   # the table of finished runs
#
# Knobs (environment): ARCHS (default: every registered arch), STEPS (the compiled pre_ln's, 50), SWEEP_STEPS
# (the eager runs' steps; default: the budget plan's, at most STEPS and at least MIN_STEPS=15), SWEEP_COMPILE
# (1: the sweep compiled too, each arch paying EST_COMPILE_NEXT_S; worth it with a warm INDUCTOR_CACHE from an
# earlier try), BATCH (micro-batch, 32),
# ACCUM (grad accumulation, 2), NPROC (1), BUDGET_S (total time budget, 480 = 8 minutes: archs that
# would not fit are skipped and reported), RUN_TIMEOUT_S (per run, 300), OUT (output dir), PYTHON, PEAK_FLOPS
# (override the peak table: needed for GPUs other than A100/H100/H200), EXTRA (more Hydra
# overrides), EAGER_REF (1: the eager pre_ln run; 0: skip it), CLAIM (the claim of the smoke run,
# rmsnorm_parity; none: skip it), CLAIM_STEPS (100), DDP_SMOKE (1: the 2-GPU DDP run when
# 2+ GPUs exist; 0: skip), NO_INSTALL (1: never install), DRY_RUN_GPUS (GPUs a dry run pretends to see,
# default 2), INDUCTOR_CACHE (torch.compile's cache, shared by the runs and kept for a second try;
# default outputs/gpu_check/inductor-cache), EST_START_S / EST_COMPILE_S / EST_COMPILE_NEXT_S / EST_MFU /
# EST_EAGER_MFU (the budget plan's estimates: 20 s, 60 s, 35 s, 0.40, 0.25; the start-up includes the run's final
# checkpoint, 1.5 GB at gpt2_124m, about 5 s: each run's checkpoints are deleted once it ends, so the disk holds
# none beyond the run in progress, and the arch runs keep the spec's defaults otherwise: precision and compile as
# given here, TF32 for what stays fp32).
# Setup, without PYTHON=: VENV (.venv) if it imports torch and normbench; else NODE_PYTHON (python3) if it
# does; else, with a wheelhouse (WHEELS=DIR, or ./wheelhouse), `make install-offline` (a venv that keeps
# NODE_PYTHON's torch, no network, rebuilt when another Python made it; docs/scale-out.md, "An air-gapped
# node"); else, when the index (INDEX_URL, default $PIP_INDEX_URL or PyPI) answers and no VENV is there,
# `make install` (PyPI's CUDA torch); else it stops, saying what is missing and how to bring a wheelhouse
# (for NODE_PYTHON's version and platform). A dry run prints the setup a run without PYTHON= would do, and
# on a machine where nothing imports normbench yet, the plan by the estimates alone (archs from conf/arch).
# Exit status: 0 all runs completed, 1 a run failed, 2 no usable GPU / setup error.
# MFU = (6N + 12 L d T) x tokens/s / (peak bf16 FLOP/s x GPUs), see src/normbench/runtime/flops.py.
set -uo pipefail

# a wheelhouse named relative to where the command was given, before moving to the checkout
if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then WHEELS=$(cd "$WHEELS" && pwd); fi
cd "$(dirname "$0")/.." || exit 2
DRY_RUN=${DRY_RUN:-0}
TABLE_ONLY=${TABLE_ONLY:-0}
die() { echo "gpu_check: error: $*" >&2; exit 2; }

VENV=${VENV:-.venv}
NODE_PYTHON=${NODE_PYTHON:-python3}
WHEELS=${WHEELS:-}
[ -z "$WHEELS" ] && [ -d wheelhouse ] && WHEELS=wheelhouse
INDEX_URL=${INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple/}}

# cannot_import PY: which of torch and normbench PY cannot import ("torch", "normbench", "torch and normbench");
# empty when both import
cannot_import() {
    local out
    out=$("$1" -c 'import importlib
bad = []
for name in ("torch", "normbench"):
    try:
        importlib.import_module(name)
    except Exception:
        bad.append(name)
print(" and ".join(bad) or "ok")' 2>/dev/null)
    case "$out" in ok) ;; torch | normbench | "torch and normbench") echo "$out" ;; *) echo "torch and normbench" ;; esac
}

# the node Python's version and platform tag, for the wheelhouse it needs (make wheelhouse WHEEL_PYTHON= WHEEL_PLATFORM=)
node_target() {
    "$NODE_PYTHON" -c 'import platform, sys, sysconfig
lib, ver = platform.libc_ver()
arch = sysconfig.get_platform().split("-")[-1]
plat = "manylinux_%s_%s" % (ver.replace(".", "_"), arch) if lib == "glibc" and ver else sysconfig.get_platform()
print(f"WHEEL_PYTHON={sys.version_info[0]}.{sys.version_info[1]} WHEEL_PLATFORM={plat}")' 2>/dev/null \
        || echo "WHEEL_PYTHON=<its major.minor> WHEEL_PLATFORM=<its platform, e.g. manylinux_2_28_x86_64>"
}

# the setup a run without PYTHON= does: SETUP_PY (the Python it ends with), SETUP_CMD (the install, if
# any), SETUP_WHY (in words); SETUP_PY empty: nothing usable and no way to install
plan_setup() {
    SETUP_CMD=()
    local venv_miss= node_miss offline=(make install-offline "WHEELS=$WHEELS" "PY=$NODE_PYTHON" "VENV=$VENV")
    local bring="build a wheelhouse where an index is reachable (make wheelhouse $(node_target) HAVE=<the node's pip \
freeze>), copy it here and rerun with WHEELS=DIR (docs/scale-out.md, \"An air-gapped node\")"
    [ -x "$VENV/bin/python" ] && venv_miss=$(cannot_import "$VENV/bin/python")
    node_miss=$(cannot_import "$NODE_PYTHON")
    if [ -x "$VENV/bin/python" ] && [ -z "$venv_miss" ]; then
        SETUP_PY=$VENV/bin/python SETUP_WHY="$VENV exists and imports torch and normbench: using it"
    elif [ -x "$VENV/bin/python" ] && [ -n "$WHEELS" ]; then
        SETUP_PY=$VENV/bin/python SETUP_CMD=("${offline[@]}")
        SETUP_WHY="$VENV cannot import $venv_miss: the offline install from the wheelhouse $WHEELS again (it rebuilds \
a $VENV that another Python made)"
    elif [ -x "$VENV/bin/python" ] && [ -z "$node_miss" ]; then
        SETUP_PY=$NODE_PYTHON SETUP_WHY="$VENV cannot import $venv_miss, $NODE_PYTHON imports torch and normbench: using it"
    elif [ -x "$VENV/bin/python" ]; then
        SETUP_PY= SETUP_WHY="$VENV cannot import $venv_miss, $NODE_PYTHON cannot import $node_miss and no wheelhouse \
(WHEELS=DIR or ./wheelhouse) is here: $bring; or remove $VENV (rm -rf $VENV) and rerun"
    elif [ -z "$node_miss" ]; then
        SETUP_PY=$NODE_PYTHON SETUP_WHY="$NODE_PYTHON imports torch and normbench: using it"
    elif [ -n "$WHEELS" ]; then
        SETUP_PY=$VENV/bin/python SETUP_CMD=("${offline[@]}")
        SETUP_WHY="no $VENV, $NODE_PYTHON has no normbench: the offline install from the wheelhouse $WHEELS (no index; $VENV keeps $NODE_PYTHON's torch)"
        [ "$node_miss" = normbench ] || SETUP_WHY+=" ($NODE_PYTHON cannot import torch either: the install will say so)"
    elif "$NODE_PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
        "$INDEX_URL" >/dev/null 2>&1; then
        SETUP_PY=$VENV/bin/python SETUP_CMD=(make install "PY=$NODE_PYTHON" "VENV=$VENV")
        SETUP_WHY="no $VENV, $NODE_PYTHON has no normbench, the index $INDEX_URL answers: make install (torch with CUDA from PyPI)"
    else
        SETUP_PY=
        SETUP_WHY="no $VENV, $NODE_PYTHON cannot import $node_miss, no wheelhouse (WHEELS=DIR or ./wheelhouse) \
and no index reachable at $INDEX_URL: $bring"
    fi
}

if [ "$DRY_RUN" = 1 ] && [ "$TABLE_ONLY" != 1 ]; then
    plan_setup
    echo "gpu_check: setup: $SETUP_WHY${PYTHON:+ (this run: PYTHON=$PYTHON given, nothing installed)}"
    [ "${#SETUP_CMD[@]}" -gt 0 ] && echo "gpu_check: setup: would run: ${SETUP_CMD[*]}"
    if [ -z "${PYTHON:-}" ]; then
        miss=$([ -n "$SETUP_PY" ] && cannot_import "$SETUP_PY" || echo "torch and normbench")
        if [ -n "$miss" ]; then
            # nothing here imports normbench yet (the setup above has not run): the plan by the estimates alone
            PLAN_ONLY=1
            echo "gpu_check: dry run: ${SETUP_PY:-no Python here} cannot import $miss yet: the plan below is by the" \
                "estimates alone (archs from conf/arch, each costed as a standard GPT block); the config checks" \
                "need normbench installed (rerun the dry run after the setup, or with PYTHON=)"
            for PYTHON in "$NODE_PYTHON" python3; do "$PYTHON" -c pass 2>/dev/null && break; done
        else
            PYTHON=$SETUP_PY
        fi
    fi
elif [ -z "${PYTHON:-}" ]; then
    plan_setup
    [ -n "$SETUP_PY" ] || die "$SETUP_WHY"
    echo "gpu_check: setup: $SETUP_WHY"
    if [ "${#SETUP_CMD[@]}" -gt 0 ]; then
        [ "${NO_INSTALL:-0}" = 1 ] && die "NO_INSTALL=1, and the setup needs: ${SETUP_CMD[*]}"
        "${SETUP_CMD[@]}" >&2 || die "${SETUP_CMD[*]} failed (above)"
    fi
    PYTHON=$SETUP_PY
fi
PLAN_ONLY=${PLAN_ONLY:-0}
if [ "$PLAN_ONLY" = 1 ] && [ -z "${ARCHS:-}" ]; then  # the registry's archs, as their config files name them
    ARCHS="pre_ln $(for f in conf/arch/*.yaml; do a=$(basename "$f" .yaml); [ "$a" = pre_ln ] || printf '%s ' "$a"; done)"
fi
ARCHS=${ARCHS:-$("$PYTHON" -c "from normbench.validation import ARCHS; print(' '.join(ARCHS))" 2>/dev/null)} \
    || die "cannot read the arch registry with $PYTHON (it cannot import $(cannot_import "$PYTHON"))"
[ -n "$ARCHS" ] || die "cannot read the arch registry with $PYTHON (it cannot import $(cannot_import "$PYTHON"))"
STEPS=${STEPS:-50}
BATCH=${BATCH:-32}
ACCUM=${ACCUM:-2}
NPROC=${NPROC:-1}
BUDGET_S=${BUDGET_S:-480}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-300}
OUT=${OUT:-outputs/gpu_check/$(date +%Y%m%d-%H%M%S)}
EXTRA=${EXTRA:-}
EAGER_REF=${EAGER_REF:-1}
CLAIM=${CLAIM:-rmsnorm_parity}
CLAIM_STEPS=${CLAIM_STEPS:-100}
MIN_STEPS=${MIN_STEPS:-15}
SWEEP_COMPILE=${SWEEP_COMPILE:-0}
WRITE_DOC_GIVEN=$([ "${WRITE_DOC:-}" = 1 ] && echo 1)
WRITE_DOC=${WRITE_DOC:-1}
DOC=${DOC:-docs/performance.md}
DDP_SMOKE=${DDP_SMOKE:-1}
# torch.compile's caches (inductor's FX graphs, triton kernels) shared by every run: kernels common to two
# archs are compiled once, and a second try of the check starts warm
export TORCHINDUCTOR_CACHE_DIR=${INDUCTOR_CACHE:-$PWD/outputs/gpu_check/inductor-cache}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
[ "$(( ACCUM % NPROC ))" -eq 0 ] || die "ACCUM=$ACCUM must be a multiple of NPROC=$NPROC"

# the overrides every arch run shares (the table recomputes the memory estimate from them)
COMMON="model=gpt2_124m data.tokenizer=gpt2 precision=bf16 device=cuda diag=off \
trainer.batch_size=$BATCH trainer.grad_accum=$ACCUM \
trainer.log_every=10 trainer.eval_every=100000 trainer.eval_batches=1 trainer.ckpt_every=100000 \
sched.warmup_steps=5${PEAK_FLOPS:+ peak_flops=$PEAK_FLOPS}"

# ---- the table, from each run's summary.json (scripts/gpu_table.py); into DOC's GPU section when DOC_HEADER is set
table() {
    "$PYTHON" scripts/gpu_table.py "$OUT" --common "$COMMON $EXTRA" --archs "$ARCHS" --skipped "${skipped[*]:-}" \
        ${DOC_HEADER:+--doc "$DOC" --header "$DOC_HEADER"}
}

if [ "$TABLE_ONLY" = 1 ]; then
    # a table of finished runs goes into the doc only when asked (WRITE_DOC=1 given)
    [ "$WRITE_DOC_GIVEN" = 1 ] && DOC_HEADER=${DOC_HEADER:-"gpu_check.sh's table of $OUT (TABLE_ONLY)"}
    table
    exit $?
fi

# ---- fail fast: a CUDA GPU, torch built with CUDA, normbench importable, flash attention usable
if [ "$DRY_RUN" = 1 ]; then
    gpus=${DRY_RUN_GPUS:-2}
    echo "gpu_check: dry run (no GPU used), pretending $gpus GPU(s)"
else
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
# flash attention for the runs' shape (12 heads of 64, bf16, causal): the kernel SDPA picks first
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F
q = torch.randn(2, 12, 1024, 64, device="cuda", dtype=torch.bfloat16)
try:
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=8.0)  # nGPT's softmax scale
except RuntimeError as exc:
    sys.exit(f"flash attention is not usable here for bf16, head_dim 64 ({str(exc).splitlines()[0]})")
from normbench.runtime.flops import gpu_peak_flops
name = torch.cuda.get_device_name(0)
peak = gpu_peak_flops(name)
print(f"{torch.cuda.device_count()}|{name} | torch {torch.__version__} | CUDA {torch.version.cuda} | bf16 peak "
      f"{'%.0f TFLOP/s' % (peak / 1e12) if peak else 'unknown (set PEAK_FLOPS=)'} | flash attention ok")
EOF
) || die "$info"
    gpus=${info%%|*}
    GPU_INFO=${info#*|}
    GPU_NAME=${GPU_INFO%% | *}
    echo "gpu_check: ${info#*|}"
fi

launcher=("$PYTHON" -m normbench)
parallel=none
if [ "$NPROC" -gt 1 ]; then
    launcher=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" -m normbench)
    parallel=ddp
fi
sweep_mode=eager
[ "$SWEEP_COMPILE" = 1 ] && sweep_mode=compiled
echo "gpu_check: gpt2_124m, micro-batch ${BATCH} x accum ${ACCUM} x 1024 tokens, bf16, ${NPROC} GPU(s); the first arch compiled, ${STEPS} steps; the sweep ${sweep_mode} -> $OUT"
echo "gpu_check: archs: $ARCHS"
first_arch=${ARCHS%% *}
[[ " $ARCHS " == *" pre_ln "* ]] && first_arch=pre_ln
rest_archs=$(for a in $ARCHS; do [ "$a" = "$first_arch" ] || printf '%s ' "$a"; done)
do_eager=0
[ "$EAGER_REF" = 1 ] && [ "$first_arch" = pre_ln ] && do_eager=1
do_ddp=0
[ "$DDP_SMOKE" = 1 ] && [ "$gpus" -ge 2 ] && do_ddp=1
[ "$CLAIM" = none ] && CLAIM=
# the claim's own scale=gpu settings (gpt2_124m, bf16, eager), one seed, shortened
CLAIM_ARGS="$CLAIM scale=gpu seeds=1 out=$OUT/claims trainer.max_steps=$CLAIM_STEPS trainer.eval_every=100 \
trainer.eval_batches=2 trainer.ckpt_every=100000 trainer.log_every=50 diag=off"

# ---- the budget plan: each run's time by the estimates (EST_*), against BUDGET_S; it picks the sweep's steps
# shellcheck disable=SC2046
budget=$("$PYTHON" scripts/gpu_budget.py --first "$first_arch" --rest "$rest_archs" $([ "$do_eager" = 1 ] && echo --eager) \
    --claim "${CLAIM:-}" $([ "$do_ddp" = 1 ] && echo --ddp) --common "$COMMON" --gpu "${PEAK_FLOPS:-${GPU_NAME:-H200}}" \
    --budget "$BUDGET_S" --steps "$STEPS" --min-steps "$MIN_STEPS" --sweep "$sweep_mode" --fit-steps \
    --batch "$BATCH" --accum "$ACCUM" --nproc "$NPROC" --claim-steps "$CLAIM_STEPS" \
    $([ "$PLAN_ONLY" = 1 ] && echo --standard-flops) \
    --start "${EST_START_S:-20}" --compile "${EST_COMPILE_S:-60}" --compile-next "${EST_COMPILE_NEXT_S:-35}" \
    --mfu "${EST_MFU:-0.40}" --eager-mfu "${EST_EAGER_MFU:-0.25}") || die "cannot make the budget plan (above)"
echo "$budget"
SWEEP_STEPS=${SWEEP_STEPS:-$(sed -n 's/.*sweep_steps=\([0-9]*\).*/\1/p' <<<"$budget")}
[ -n "$SWEEP_STEPS" ] || die "the budget plan named no sweep_steps (above)"

# one run: run NAME TIMEOUT LAUNCHER... -- OVERRIDES...; DRY_RUN prints the command instead
run() {
    local name=$1 limit=$2
    shift 2
    local cmd=("$@")
    [ "$name" = claim_smoke ] || cmd+=(hydra.run.dir="$OUT/$name")
    if [ "$DRY_RUN" = 1 ]; then
        echo "gpu_check: [$name] would run: ${cmd[*]}"
        local i
        for i in "${!cmd[@]}"; do  # the overrides after `train`, checked below as the trainer would
            if [ "${cmd[$i]}" = train ]; then
                planned+=("${cmd[*]:$((i + 1))}")
                break
            fi
        done
        return 0
    fi
    echo "gpu_check: [$name] running ... (log: $OUT/$name.log)"
    timeout --signal=TERM --kill-after=30 "$limit" "${cmd[@]}" >"$OUT/$name.log" 2>&1
    local rc=$?
    drop_checkpoints "$OUT/$name"
    return "$rc"
}

# a run's checkpoints (1.5 GB each at gpt2_124m; the claim's under its own run dirs) are not part of the check:
# deleted as soon as the run ends, so the disk never holds more than the one of the run in progress
drop_checkpoints() {
    [ -d "$1" ] && find "$1" -depth -type d -name checkpoints -exec rm -rf {} +
    return 0
}

[ "$DRY_RUN" = 1 ] || mkdir -p "$OUT" "$TORCHINDUCTOR_CACHE_DIR" || die "cannot create $OUT"
planned=()
start=$(date +%s)
slowest=0
failed=0
skipped=()

arch_run() {  # arch_run NAME ARCH COMPILE STEPS: one arch's run, timed; returns its exit status
    local name=$1 arch=$2 compile=$3 steps=$4 t0 rc took
    t0=$(date +%s)
    # shellcheck disable=SC2086
    run "$name" "$RUN_TIMEOUT_S" "${launcher[@]}" train $COMMON arch="$arch" compile="$compile" \
        trainer.max_steps="$steps" parallel="$parallel" $EXTRA
    rc=$?
    took=$(( $(date +%s) - t0 ))
    # the measure of the next sweep run: the slowest one so far (the compiled first run is no measure of it)
    if [ "$name" != "$first_arch" ] && [ "$took" -gt "$slowest" ]; then slowest=$took; fi
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "gpu_check: [$name] FAILED (exit $rc after ${took}s); last lines of $OUT/$name.log:" >&2
        tail -n 15 "$OUT/$name.log" >&2
    elif [ "$DRY_RUN" != 1 ]; then
        echo "gpu_check: [$name] done in ${took}s"
    fi
    return "$rc"
}

# the reference first, compiled: if it fails, the setup is wrong and nothing else is worth the GPU time
if ! arch_run "$first_arch" "$first_arch" true "$STEPS"; then
    echo "gpu_check: the first run failed: stopping here (fix the setup, then rerun)" >&2
    exit 1
fi

# the first run's speed, as logged and as the wall clock says (issue 51): the logged steady-state tokens/s and MFU
# (wall clock between log steps' syncs, from the sixth step) against the run's average over its wall time less
# evaluations and checkpoints (start-up and compiling included, so lower); the MFU goal is llm-foundry's 45%
[ "$DRY_RUN" = 1 ] || "$PYTHON" - "$OUT/$first_arch/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
train_s = s["wall_s"] - s.get("eval_s", 0) - s.get("ckpt_s", 0)
mfu = f"{s['mfu']:.1%} (goal >= 45%)" if s.get("mfu") is not None else "unknown (no peak: PEAK_FLOPS=)"
print(f"gpu_check: speed: logged {s['tokens_per_s']:,.0f} tok/s steady, MFU {mfu}; wall clock: {s['tokens']:,} tokens "
      f"in {train_s:.1f} s of training = {s['tokens'] / train_s:,.0f} tok/s with start-up and compiling "
      f"(precision {s['precision']}, compiled {s['compiled']})")
EOF

# eager pre_ln: how much compile buys on this GPU, and the reference of the eager sweep
if [ "$do_eager" = 1 ]; then arch_run pre_ln_eager pre_ln false "$SWEEP_STEPS"; fi

# the claim smoke run: reproduce's sweep (2 runs), measurement, verdict and report on CUDA; one seed is too few
# for a verdict to mean anything, so only its completing is checked
if [ -n "$CLAIM" ]; then
    if [ "$DRY_RUN" = 1 ] && [ "$PLAN_ONLY" != 1 ]; then
        # shellcheck disable=SC2086
        "$PYTHON" -m normbench reproduce $CLAIM_ARGS $EXTRA --dry-run >/dev/null \
            || die "the claim smoke run's plan is refused: $PYTHON -m normbench reproduce $CLAIM_ARGS --dry-run"
    fi
    # shellcheck disable=SC2086
    run claim_smoke "$(( 2 * RUN_TIMEOUT_S ))" "$PYTHON" -m normbench reproduce $CLAIM_ARGS $EXTRA \
        || { failed=1; echo "gpu_check: [claim_smoke] FAILED; see $OUT/claim_smoke.log" >&2; }
    [ "$DRY_RUN" = 1 ] || drop_checkpoints "$OUT/claims"
fi

# ---- CHECKPOINT COST (issue 51, item 4) ------------------------------------------------------------------------
# gpt2_124m's checkpoint written synchronously and in the background, both formats (single file and sharded DCP):
# seconds the training is held up against the whole write, and the share of the default 600 s interval
# (scripts/gpu_ckpt_check.py, into $OUT/ckpt_cost.json; it deletes what it writes). CKPT_COST=0 leaves it out.
if [ "${CKPT_COST:-1}" = 1 ]; then
    if [ "$DRY_RUN" = 1 ]; then
        echo "gpu_check: [ckpt_cost] would run: $PYTHON scripts/gpu_ckpt_check.py --out $OUT"
    else
        echo "gpu_check: [ckpt_cost] running ... (log: $OUT/ckpt_cost.log)"
        timeout --signal=TERM --kill-after=30 "$RUN_TIMEOUT_S" "$PYTHON" scripts/gpu_ckpt_check.py --out "$OUT" \
            >"$OUT/ckpt_cost.log" 2>&1 || { failed=1; echo "gpu_check: [ckpt_cost] FAILED; see $OUT/ckpt_cost.log" >&2; }
        tail -n 6 "$OUT/ckpt_cost.log"
    fi
fi

# DDP smoke run: 2 processes, 10 steps, eager (the sweep's mode), when 2+ GPUs exist
if [ "$do_ddp" = 1 ]; then
    # shellcheck disable=SC2086
    run ddp_smoke "$RUN_TIMEOUT_S" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=2 -m normbench \
        train $COMMON arch=pre_ln compile=false parallel=ddp trainer.max_steps=10 $EXTRA \
        || { failed=1; echo "gpu_check: [ddp_smoke] FAILED; see $OUT/ddp_smoke.log" >&2; }
elif [ "$DDP_SMOKE" = 1 ]; then
    echo "gpu_check: one GPU: no DDP smoke run (it needs 2)"
fi

# the other archs, while the budget lasts (the slowest sweep run so far as the measure of the next)
sweep_compile=false
[ "$SWEEP_COMPILE" = 1 ] && sweep_compile=true
for arch in $rest_archs; do
    if [ "$DRY_RUN" != 1 ] && [ $(( $(date +%s) - start + slowest )) -gt "$BUDGET_S" ]; then
        skipped+=("$arch")
        continue
    fi
    arch_run "$arch" "$arch" "$sweep_compile" "$SWEEP_STEPS"
done

if [ "$DRY_RUN" = 1 ] && [ "$PLAN_ONLY" = 1 ]; then
    echo "gpu_check: dry run done: ${#planned[@]} runs planned; their configs are checked once normbench is installed"
    exit 0
fi
if [ "$DRY_RUN" = 1 ]; then
    # every planned run's config composes and passes normbench's checks (the CPU side of each run)
    "$PYTHON" - "${planned[@]}" <<'EOF' || die "a planned run's config is refused (above)"
import sys
from normbench.config.files import compose_config
from normbench.validation import validate
from normbench.errors import ConfigError
from normbench.model import check_combination

for line in sys.argv[1:]:
    overrides = [o for o in line.split() if not o.startswith("hydra.")]
    try:
        cfg = compose_config(overrides)
        validate(cfg)
        check_combination(cfg)
    except ConfigError as exc:
        sys.exit(f"gpu_check: {exc} (in: {line})")
print(f"gpu_check: dry run done: {len(sys.argv) - 1} run configs compose and pass the config checks")
EOF
    exit 0
fi
if [ "$WRITE_DOC" = 1 ]; then
    DOC_HEADER="gpu_check.sh on ${GPU_INFO:-a GPU}, $(date -u +%Y-%m-%d): gpt2_124m, bf16, micro-batch $BATCH x \
accum $ACCUM x 1024 tokens, $NPROC GPU(s); pre_ln compiled at $STEPS steps, the sweep $sweep_mode at $SWEEP_STEPS \
steps (OUT=$OUT)"
fi
table
table_rc=$?
if [ "${#skipped[@]}" -gt 0 ]; then
    echo "gpu_check: skipped to stay within BUDGET_S=${BUDGET_S}s: ${skipped[*]}"
    echo "gpu_check: a second try of just those, into this table: OUT=$OUT ARCHS=\"${skipped[*]}\" EAGER_REF=0 CLAIM=none SWEEP_STEPS=$SWEEP_STEPS bash scripts/gpu_check.sh"
fi
echo "gpu_check: total $(( $(date +%s) - start ))s; runs in $OUT"
if [ "$failed" -ne 0 ] || [ "$table_rc" -ne 0 ]; then
    exit 1
fi
exit 0
