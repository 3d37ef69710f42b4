#!/usr/bin/env bash
# Compare the benches of REF (A) against the work tree (B), interleaved.
#
#   scripts/bench-compare.sh [-n ROUNDS] [-b "BENCH ..."] [--ref-benches] [--keep] REF
#
# REF is any commit (main, HEAD~3, a branch). Its tree is exported with
# `git archive` into a temporary directory with a target/ of its own (it
# shares nothing with this work tree but cargo's registry), both are built
# with `cargo bench --no-run`, then each bench runs A, B, A, B… for ROUNDS
# rounds (default 3), so a change in the machine's load falls on both
# sides alike. Every `FIGURE <name> <value> <unit> <lower|higher>
# [target<op><value>]` line a bench prints (benches/support/figures.rs) is
# collected; the table gives each figure's median under A and B, the ratio
# B/A, whether B is better or worse (beyond 3%), and whether B meets the
# figure's target. CPU figures come first: on a shared machine they are the
# ones to trust (wall time swings with the other load). The machine's load
# average is printed before each run.
#
# By default the work tree's benches/ and tests/it/support/ replace REF's
# (the same bench code measuring both builds, so the figures compare) and
# [[bench]] entries REF lacks are added to its Cargo.toml; a bench that
# does not build against REF (it reads a figure REF does not keep) is
# replaced by REF's own version of it (figures it does not print show as
# "-"). --ref-benches uses REF's own from the start.
#
# Benches: -b "pipeline stop_latency first_token footprint" by default
# (engine, store, command and schedule too if named). The temporary
# directory (a few GB of target/) is removed at the end unless --keep, or
# unless it is BENCH_COMPARE_DIR (kept, so the next comparison rebuilds
# REF incrementally; remove it when done).
# Arguments for a bench binary can be given in BENCH_ARGS_<name>
# (e.g. BENCH_ARGS_engine="w3 mt"); other environment (PIPELINE_PER_CHAT…)
# passes through to both sides. Extra cargo arguments for one side:
# BENCH_CARGO_ARGS_A / BENCH_CARGO_ARGS_B (e.g.
# `BENCH_CARGO_ARGS_A=--no-default-features scripts/bench-compare.sh HEAD`
# compares glibc's malloc against the default mimalloc on the same commit).
#
# Do not build another commit by hand into this work tree's target dir
# (CARGO_TARGET_DIR=.../target in a worktree of REF): its bench binaries
# get the same names (target/release/deps/pipeline-<hash>), and cargo,
# finding that tree's sources unchanged, then takes them as up to date for
# this one, so `cargo bench` here measures REF. It happened once: a
# profile showed code removed eight commits earlier. `touch src/lib.rs`
# forces the rebuild; this script's own target dirs never mix.
set -euo pipefail

rounds=3
benches="pipeline stop_latency first_token footprint"
ref_benches=0
keep=0
ref=""
while [ $# -gt 0 ]; do
    case "$1" in
        -n) rounds="$2"; shift 2 ;;
        -b) benches="$2"; shift 2 ;;
        --ref-benches) ref_benches=1; shift ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) ref="$1"; shift ;;
    esac
done
if [ -z "$ref" ]; then
    echo "usage: $0 [-n ROUNDS] [-b \"BENCH ...\"] [--ref-benches] [--keep] REF" >&2
    exit 2
fi

root=$(git rev-parse --show-toplevel)
ref_commit=$(git -C "$root" rev-parse --verify "$ref^{commit}")
if [ -n "${BENCH_COMPARE_DIR:-}" ]; then
    # A directory kept between comparisons: REF's build is incremental.
    tmp="$BENCH_COMPARE_DIR"
    keep=1
    mkdir -p "$tmp"
else
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")
fi
cleanup() {
    if [ "$keep" = 1 ]; then
        echo "kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT

log() { echo "bench-compare: $*" >&2; }

export_ref() {
    rm -rf "$tmp/ref" "$tmp/out"
    mkdir -p "$tmp/ref"
    git -C "$root" archive "$ref_commit" | tar -x -C "$tmp/ref"
}

# The work tree's benches over REF's, and the [[bench]] entries REF lacks.
overlay_benches() {
    rm -rf "$tmp/ref/benches" "$tmp/ref/tests/it/support"
    cp -r "$root/benches" "$tmp/ref/benches"
    mkdir -p "$tmp/ref/tests/it"
    cp -r "$root/tests/it/support" "$tmp/ref/tests/it/support"
    python3 - "$root/Cargo.toml" "$tmp/ref/Cargo.toml" <<'EOF'
import re, sys
ours, theirs = (open(p).read() for p in sys.argv[1:3])
have = set(re.findall(r'\[\[bench\]\]\s*\nname\s*=\s*"([^"]+)"', theirs))
add = [b for b in re.findall(r'(\[\[bench\]\]\s*\nname\s*=\s*"([^"]+)"[^\[]*)', ours) if b[1] not in have]
with open(sys.argv[2], "a") as f:
    for block, _ in add:
        f.write("\n" + block.rstrip() + "\n")
EOF
}

# Builds the benches in $1 (target dir $2, extra cargo arguments $3 if any);
# prints "name path" per bench.
build() {
    local dir="$1" target="$2" args="${3:-}"
    # shellcheck disable=SC2086 # the extra arguments are words
    (cd "$dir" && CARGO_TARGET_DIR="$target" cargo bench --locked --no-run $args \
        --message-format=json 2>"$tmp/build.err") |
        jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["bench"] and .executable != null)
               | "\(.target.name) \(.executable)"'
}

export_ref
if [ "$ref_benches" = 0 ]; then
    overlay_benches
fi
log "building A = $ref ($ref_commit) in $tmp/ref"
# A bench of the work tree that does not build against REF (it reads
# something REF lacks) falls back to REF's own version of it, one by one.
for attempt in 1 2 3 4 5 6 7 8; do
    if build "$tmp/ref" "$tmp/target" "${BENCH_CARGO_ARGS_A:-}" >"$tmp/a.list" && [ -s "$tmp/a.list" ]; then
        break
    fi
    failing=$(sed -n 's/.*could not compile `telegate` (bench "\([a-z_]*\)").*/\1/p' "$tmp/build.err" | sort -u)
    if [ "$ref_benches" = 1 ] || [ -z "$failing" ] || [ "$attempt" = 8 ]; then
        tail -n 40 "$tmp/build.err" >&2
        exit 1
    fi
    for bench in $failing; do
        if git -C "$root" cat-file -e "$ref_commit:benches/$bench.rs" 2>/dev/null; then
            log "bench $bench of the work tree does not build against $ref; using $ref's own"
            git -C "$root" show "$ref_commit:benches/$bench.rs" >"$tmp/ref/benches/$bench.rs"
        else
            log "bench $bench does not build against $ref and $ref has none; left out"
            : >"$tmp/ref/benches/$bench.rs"
            echo 'fn main() {}' >"$tmp/ref/benches/$bench.rs"
        fi
    done
done
log "building B = work tree ($root)"
build "$root" "${CARGO_TARGET_DIR:-$root/target}" "${BENCH_CARGO_ARGS_B:-}" >"$tmp/b.list" || { cat "$tmp/build.err" >&2; exit 1; }

exe_of() { awk -v n="$2" '$1 == n { print $2 }' "$1" | tail -n 1; }

mkdir -p "$tmp/out"
for round in $(seq 1 "$rounds"); do
    for bench in $benches; do
        for side in A B; do
            list="$tmp/a.list"
            [ "$side" = B ] && list="$tmp/b.list"
            exe=$(exe_of "$list" "$bench")
            if [ -z "$exe" ]; then
                log "round $round: $side has no bench $bench"
                continue
            fi
            var="BENCH_ARGS_$bench"
            log "round $round/$rounds: $bench on $side (load $(cut -d' ' -f1-3 /proc/loadavg))"
            # Run from the side's own tree: benches find their files there.
            dir="$tmp/ref"
            [ "$side" = B ] && dir="$root"
            # shellcheck disable=SC2086
            (cd "$dir" && "$exe" --bench ${!var:-}) >"$tmp/out/$side.$bench.$round" 2>&1 ||
                log "  $bench on $side exited non-zero (its figures still count)"
            grep -c '^FIGURE ' "$tmp/out/$side.$bench.$round" >/dev/null ||
                log "  $bench on $side printed no FIGURE line"
        done
    done
done

python3 - "$tmp/out" "$ref" <<'EOF'
import os, re, statistics, sys
out, ref = sys.argv[1], sys.argv[2]
figs = {}   # name -> {"A": [..], "B": [..], "unit", "better", "target"}
order = []
for f in sorted(os.listdir(out)):
    side = f.split(".")[0]
    for line in open(os.path.join(out, f), errors="replace"):
        m = re.match(r"FIGURE (\S+) (\S+) (\S+) (lower|higher)(?: target(<=|>=)(\S+))?", line)
        if not m:
            continue
        name, value, unit, better, op, target = m.groups()
        try:
            value = float(value)
        except ValueError:
            continue
        if name not in figs:
            figs[name] = {"A": [], "B": [], "unit": unit, "better": better, "target": None}
            order.append(name)
        figs[name][side].append(value)
        if target is not None:
            figs[name]["target"] = (op, float(target))

def key(name):
    # CPU figures first (the ones to trust on a shared machine), then the
    # store's counts, then wall time; bench order kept within each.
    n = name.lower()
    rank = 0 if "cpu" in n else 1 if ("store_" in n or "heap" in n or "rss" in n or "size" in n) else 2
    return (rank, order.index(name))

def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 10 else f"{v:.3g}"

rows = [("figure", "unit", "A median", "B median", "B/A", "", "target", "B meets")]
for name in sorted(figs, key=key):
    f = figs[name]
    a = statistics.median(f["A"]) if f["A"] else None
    b = statistics.median(f["B"]) if f["B"] else None
    ratio = b / a if a not in (None, 0) and b is not None else None
    verdict = ""
    if ratio is not None and "load_average" not in name:
        gain = ratio < 0.97 if f["better"] == "lower" else ratio > 1.03
        loss = ratio > 1.03 if f["better"] == "lower" else ratio < 0.97
        verdict = "better" if gain else "WORSE" if loss else "same"
    target, meets = "-", "-"
    if f["target"]:
        op, t = f["target"]
        target = f"{op}{fmt(t)}"
        if b is not None:
            meets = "yes" if (b <= t if op == "<=" else b >= t) else "NO"
    spread = lambda vs: f" ({fmt(min(vs))}..{fmt(max(vs))})" if len(vs) > 1 else ""
    rows.append((name, f["unit"], fmt(a) + spread(f["A"]), fmt(b) + spread(f["B"]),
                 "-" if ratio is None else f"{ratio:.3f}", verdict, target, meets))
widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
print(f"A = {ref}, B = work tree; medians over the rounds (min..max)")
for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
EOF
