#!/usr/bin/env bash
# The air-gapped install, end to end on one machine that reaches an index (docs/scale-out.md, "An air-gapped
# node"), with the time of each step, and the wrong first steps an admin takes (issue 44):
#   1. a "node" Python: a fresh venv holding torch and packaging and nothing else of normbench's (NODE_TORCH: a
#      wheel file or a requirement, installed with this machine's pip configuration), and its freeze file;
#   2. a clean checkout (git clone of HEAD) builds its wheelhouse with that freeze file as HAVE and
#      WHEEL_EXTRAS=sweeps,dev: `make wheelhouse`, the one step that uses the index (PyPI's, with this machine's
#      own indexes and find-links hidden: HIDE_INDEXES=0 keeps them);
#   then, with the network cut off (`unshare -n` when it is allowed, e.g. as root; otherwise only pip's
#   --no-index keeps it off the network):
#   3. `make install-offline` with the wrong Python first (PY, which has no torch: refused, naming torch), then
#      with the node's: the .venv the first try left is rebuilt, and torch comes from the node (asserted: its
#      path is the node's, no torch/nvidia/triton in .venv);
#   4. a wheelhouse whose wheelhouse.json says another Python: refused, naming both, .venv left as it was;
#   5. the tests of a node Python that reaches torch through a .pth (.venv itself) and the test extra: pytest
#      runs test_wheelhouse.py's offline-install tests with .venv's Python;
#   6. pyproject.toml touched (a `git pull`): `make demo` refuses to reach for an index and names the offline
#      install; re-running it brings .venv up to date;
#   7. `make demo`'s training, short (DEMO_STEPS, default 30), and its report; its status asserted `completed`.
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
HIDE=()
if [ "${HIDE_INDEXES:-1}" = 1 ]; then
    HIDE=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null)
fi
CO=$WORK/checkout
NODE_PY=$WORK/node/bin/python

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

refused() {  # refused NAME PATTERN COMMAND...: the command must fail with PATTERN (grep -E) in its output
    local name=$1 pattern=$2
    shift 2
    step "$name" bash -c '"$@"; rc=$?; [ $rc -ne 0 ] || { echo "expected a refusal, got exit 0"; exit 1; }' _ "$@"
    check "$name" "$pattern" "$WORK/$name.log"
}

check() {  # check NAME PATTERN FILE: PATTERN (grep -E) must be in FILE, else say so and exit 1
    grep -qE -- "$2" "$3" && return 0
    echo "offline_roundtrip: $1: FAILED: no match for '$2' in $3:"
    tail -n 20 "$3"
    exit 1
}

echo "offline_roundtrip: in $WORK; node torch: $NODE_TORCH; network cut off: $([ ${#NONET[@]} -gt 0 ] && echo yes || echo 'no (unshare -n not allowed)')"
# packaging: a node has it, and normbench's build backend needs it in the wheelhouse all the same (pip builds
# in isolation), which this checks
step node-python bash -c "'$PY' -m venv '$WORK/node' && '$NODE_PY' -m pip install -q '$NODE_TORCH' packaging \
    && '$NODE_PY' -m pip list --format=freeze > '$WORK/node-freeze.txt'"
step clone git clone -q --no-hardlinks "$REPO" "$CO"
step wheelhouse "${HIDE[@]}" make -C "$CO" wheelhouse PY="$PY" WHEELS="$WORK/wheels" HAVE="$WORK/node-freeze.txt" \
    WHEEL_EXTRAS=sweeps,dev
grep "^wheelhouse:" "$WORK/wheelhouse.log"
offline=("${NONET[@]}" make -C "$CO" install-offline WHEELS="$WORK/wheels" WHEEL_EXTRAS=sweeps,dev)

# 3. the wrong Python first (no torch: refused, naming it), then the node's: the .venv left behind is rebuilt
if "$PY" -c "import torch" 2>/dev/null; then
    step wrong-python "${offline[@]}" PY="$PY"  # this PY has a torch: the first try is not wrong, only other
else
    refused wrong-python "error: needs torch.*which is neither in the wheelhouse.*nor installed" "${offline[@]}" PY="$PY"
fi
step install-offline "${offline[@]}" PY="$NODE_PY"
check install-offline "was made by $PY .*rebuilding it" "$WORK/install-offline.log"
grep "^wheelhouse:" "$WORK/install-offline.log"
check install-offline "torch [^ ]+ from $WORK/node/lib/python[0-9.]+/site-packages/torch/" "$WORK/install-offline.log"
own=$(ls "$CO"/.venv/lib/python*/site-packages | grep -iE '^(torch|triton|nvidia)' | tr '\n' ' ')
[ -z "$own" ] || { echo "offline_roundtrip: install-offline: FAILED: .venv has its own $own"; exit 1; }

# 4. a wheelhouse for another Python: refused naming both, before anything is touched
other=$("$NODE_PY" -c 'import sys; print("3.%d" % (sys.version_info[1] + 1))')
mkdir -p "$WORK/wheels-other"
sed "s/\"python_version\": \"[0-9.]*\"/\"python_version\": \"$other\"/" "$WORK/wheels/wheelhouse.json" \
    >"$WORK/wheels-other/wheelhouse.json"
cp "$CO/.venv/normbench-offline.json" "$WORK/stamp-before.json"
refused wrong-wheelhouse "was built for Python $other on .*, but $NODE_PY is Python [0-9.]+ on .*WHEEL_PYTHON=" \
    "${NONET[@]}" make -C "$CO" install-offline WHEELS="$WORK/wheels-other" PY="$NODE_PY"
step venv-untouched cmp "$WORK/stamp-before.json" "$CO/.venv/normbench-offline.json"

# 5. .venv as a node Python (its torch through a .pth) and the test extra: the offline-install tests pass with it
step pth-torch "${NONET[@]}" bash -c "cd '$CO' && .venv/bin/python -m pytest -q -n 0 -p no:cacheprovider \
    tests/test_wheelhouse.py -k 'refuses_what_is_neither or through_a_pth or wheelhouse_for_another'"

# 6. a `git pull` that touches pyproject.toml: the Makefile names the offline install instead of going online
touch "$CO/pyproject.toml"
refused stale-venv "re-run the offline install instead: make install-offline WHEELS=$WORK/wheels" \
    "${NONET[@]}" make -C "$CO" demo
step reinstall "${offline[@]}" PY="$NODE_PY"

# 7. make demo finds the install done (were it not, it would refuse, above), trains and reports
step demo "${NONET[@]}" make -C "$CO" demo DEMO_OVERRIDES="trainer.max_steps=$DEMO_STEPS trainer.eval_every=10"
grep -E '"status"|"final_loss"' "$CO/outputs/demo/summary.json" | tr -d ' ,' | paste -sd' '
check demo '"status": "completed"' "$CO/outputs/demo/summary.json"
echo "offline_roundtrip: wheelhouse $(du -sh "$WORK/wheels" | cut -f1), $(ls "$WORK/wheels"/*.whl | wc -l) wheels"
