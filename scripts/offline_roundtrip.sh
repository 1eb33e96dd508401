#!/usr/bin/env bash
# The air-gapped install, end to end on one machine that reaches an index (docs/scale-out.md, "An air-gapped
# node"), with the time of each step:
#   1. a "node" Python: a fresh venv holding torch and packaging and nothing else of normbench's (NODE_TORCH: a
#      wheel file or a requirement, installed with this machine's pip configuration), and its freeze file;
#   2. a clean checkout (git clone of HEAD) builds its wheelhouse with that freeze file as HAVE: `make wheelhouse`
#      (this step uses the index), leaving out what the node has;
#   3. `make install-offline` into the checkout's .venv from the wheelhouse, with the network cut off
#      (`unshare -n` when it is allowed, e.g. as root; otherwise only pip's --no-index keeps it off the network);
#   4. `make demo`'s training there, short (DEMO_STEPS, default 30), and its report, also without network.
#
#   bash scripts/offline_roundtrip.sh                # in a temporary folder (WORK=DIR to choose, KEEP=1 to keep it)
#   NODE_TORCH=/opt/wheels/torch-...whl bash scripts/offline_roundtrip.sh
# Exit status: 0 every step passed, 1 one failed (its output is printed).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
PY=${PY:-python3}
NODE_TORCH=${NODE_TORCH:-$(ls /opt/wheels/torch-*.whl 2>/dev/null | head -n 1)}
NODE_TORCH=${NODE_TORCH:-torch>=2.9}
DEMO_STEPS=${DEMO_STEPS:-30}
WORK=${WORK:-$(mktemp -d /tmp/normbench-offline.XXXXXX)}
mkdir -p "$WORK" || exit 1
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
NONET=()
if unshare -n true 2>/dev/null; then NONET=(unshare -n --); fi

step() {  # step NAME COMMAND...: run it, print its seconds; on failure its output and exit 1
    local name=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    printf 'offline_roundtrip: %-16s %6.1f s  %s\n' "$name" "$(echo "$(date +%s.%N) - $t0" | bc)" \
        "$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")"
    if [ $rc -ne 0 ]; then
        tail -n 30 "$WORK/$name.log"
        exit 1
    fi
}

echo "offline_roundtrip: in $WORK; node torch: $NODE_TORCH; network cut off: $([ ${#NONET[@]} -gt 0 ] && echo yes || echo 'no (unshare -n not allowed)')"
# packaging: a node has it, and normbench's build backend needs it in the wheelhouse all the same (pip builds
# in isolation), which this checks
step node-python bash -c "'$PY' -m venv '$WORK/node' && '$WORK/node/bin/python' -m pip install -q '$NODE_TORCH' packaging \
    && '$WORK/node/bin/python' -m pip list --format=freeze > '$WORK/node-freeze.txt'"
step clone git clone -q --no-hardlinks "$REPO" "$WORK/checkout"
step wheelhouse make -C "$WORK/checkout" wheelhouse PY="$PY" WHEELS="$WORK/wheels" HAVE="$WORK/node-freeze.txt"
grep "^wheelhouse:" "$WORK/wheelhouse.log"
step install-offline "${NONET[@]}" make -C "$WORK/checkout" install-offline PY="$WORK/node/bin/python" WHEELS="$WORK/wheels"
grep "^wheelhouse:" "$WORK/install-offline.log"
# make demo must find the install done (were it not, its pip install would fail without network), then train
step demo "${NONET[@]}" make -C "$WORK/checkout" demo DEMO_OVERRIDES="trainer.max_steps=$DEMO_STEPS trainer.eval_every=10"
grep -E '"status"|"final_loss"' "$WORK/checkout/outputs/demo/summary.json" | tr -d ' ,' | paste -sd' '
echo "offline_roundtrip: wheelhouse $(du -sh "$WORK/wheels" | cut -f1), $(ls "$WORK/wheels"/*.whl | wc -l) wheels"
