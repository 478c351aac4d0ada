#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Launch check (no GPU needed): lists every kernel launch of lather's CUDA build that Kokkos makes
# through constant or global memory instead of as a kernel argument, and fails if there is one.
#
# Why: Kokkos (3.4 to 4.x) launches a functor of 512 bytes or more through the device's constant
# memory, and that launch first waits on the host for the previous constant-memory kernel to
# finish (cudaEventSynchronize): the host can no longer queue work ahead of the device. A kernel
# that needs a large functor takes impl::kernels::by_argument (include/lather/impl/kernels/launch.hpp).
# The size of a functor is known only to the compiler, so this check asks it.
#
# How: a copy of Kokkos' Cuda/Kokkos_Cuda_KernelLaunch.hpp (the install the CUDA build uses) with
# one static_assert added to CudaParallelLaunch that fails for any launch mechanism but a kernel
# argument, naming the driver type and its size; every test, benchmark, example and tool
# translation unit of the build's compile_commands.json then runs through nvcc's front end only
# (--cuda: every template is instantiated, no code is generated; 10-20 s a unit).
#
# Usage: scripts/launch-check.sh [CUDA build directory]
#   default: build-gpu-cuda (configured by scripts/gpu-compile-check.sh cuda)
# Environment: LATHER_JOBS (parallel units, default 2), LATHER_LAUNCH_CHECK_FILTER (a regular
# expression: only units whose path matches), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bdir=$(cd "${1:-$root/build-gpu-cuda}" && pwd)
jobs=${LATHER_JOBS:-2}
filter=${LATHER_LAUNCH_CHECK_FILTER:-.}
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
log() { echo "[launch-check] $*" >&2; }
[ -f "$bdir/compile_commands.json" ] || { log "no $bdir/compile_commands.json: run scripts/gpu-compile-check.sh cuda first"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The units and their nvcc commands (nvcc_wrapper --nvcc-wrapper-show prints what it would run).
python3 - "$bdir/compile_commands.json" "$root" "$filter" "$work" <<'EOF'
import json, re, shlex, sys
db, root, pattern, work = sys.argv[1:5]
units = []
for c in json.load(open(db)):
    f = c["file"]
    rel = f[len(root) + 1:] if f.startswith(root + "/") else None
    if rel is None or not re.match(r"(tests|benchmarks|examples|tools)/", rel):
        continue  # generated header checks in the build directory, third-party code
    if rel.startswith(("tests/compile_fail/", "tests/gpu_compile/", "tests/harness/")) or not re.search(pattern, rel):
        continue
    units.append((rel, c["directory"], shlex.split(c["command"])))
seen = set()
with open(f"{work}/units", "w") as out:
    for i, (rel, directory, argv) in enumerate(units):
        if rel in seen:
            continue
        seen.add(rel)
        if not argv[0].endswith("nvcc_wrapper"):
            sys.exit(f"launch-check: {rel} is not compiled by nvcc_wrapper ({argv[0]}): not a CUDA build")
        out.write(f"{i}\t{rel}\t{directory}\t{shlex.join(argv)}\n")
EOF
n_units=$(wc -l <"$work/units")
[ "$n_units" -gt 0 ] || { log "no translation units match"; exit 1; }

# The Kokkos install of the build: the directory of its nvcc_wrapper, one level up.
kokkos=$(awk -F'\t' 'NR == 1 { split($4, a, " "); print a[1]; exit }' "$work/units")
kokkos=$(cd "$(dirname "$kokkos")/.." && pwd)
src="$kokkos/include/Cuda/Kokkos_Cuda_KernelLaunch.hpp"
[ -f "$src" ] || { log "no $src"; exit 1; }
mkdir -p "$work/include/Cuda"
python3 - "$src" "$work/include/Cuda/Kokkos_Cuda_KernelLaunch.hpp" <<'EOF'
import re, sys
src, dst = sys.argv[1:3]
s = open(src).read()
probe = '''template <unsigned long DriverBytes, bool ByArgument>
struct lather_launch_probe {
  static_assert(ByArgument, "LATHER_LAUNCH_CHECK: launched through constant or global memory");
  static constexpr bool ok = true;
};
'''
anchor = "template <class DriverType>\nstruct DeduceCudaLaunchMechanism {"
# The constructor of the non-graph CudaParallelLaunch (graph nodes keep their functors in global
# memory by design, without a wait).
ctor = re.compile(r"(CudaParallelLaunch\(Args&&\.\.\. args\) \{\n)(\s+base_t::launch_kernel\()")
if s.count(anchor) != 1 or len(ctor.findall(s)) != 1:
    sys.exit("launch-check: Kokkos_Cuda_KernelLaunch.hpp does not have the expected form; update the patch")
s = s.replace(anchor, probe + anchor)
s = ctor.sub(lambda m: m.group(1) + "    (void)lather_launch_probe<sizeof(DriverType), LaunchMechanism == "
             "Experimental::CudaLaunchMechanism::LocalMemory>::ok;\n" + m.group(2), s)
open(dst, "w").write(s)
EOF

# One unit: its nvcc command with the patched header first and --cuda instead of -c.
cat >"$work/one.sh" <<EOF
#!/usr/bin/env bash
set -uo pipefail
IFS=\$'\t' read -r i rel dir cmd
cd "\$dir"
nv=\$(eval "\$cmd --nvcc-wrapper-show") || { echo "FAILED \$rel (nvcc_wrapper)" >"$work/\$i.status"; exit 0; }
nv=\$(sed -E 's/ -c / /; s/ -o [^ ]+/ /' <<<"\$nv")
eval "\${nv/ -I/ -I$work/include -I} --cuda -o $work/\$i.ii" >"$work/\$i.log" 2>&1
rc=\$?
if grep -q LATHER_LAUNCH_CHECK "$work/\$i.log"; then echo "HITS \$rel" >"$work/\$i.status"
elif [ \$rc -ne 0 ]; then echo "FAILED \$rel" >"$work/\$i.status"
else echo "OK \$rel" >"$work/\$i.status"; fi
rm -f "$work/\$i.ii"
EOF
chmod +x "$work/one.sh"
log "$n_units translation units of $bdir through nvcc's front end, $jobs at a time (Kokkos: $kokkos)"
t0=$(date +%s)
tr '\n' '\0' <"$work/units" | xargs -0 -P "$jobs" -I{} bash -c 'printf "%s\n" "$1" | "$2"' _ {} "$work/one.sh"

# Report: each launch's driver type and size, and the line of lather's code that launched it.
status=0
python3 - "$work" "$root" <<'EOF' || status=1
import glob, os, re, sys
work, root = sys.argv[1:3]
hits, failed, ok = {}, [], 0
for st in sorted(glob.glob(f"{work}/*.status")):
    kind, rel = open(st).read().split(" ", 1)
    rel = rel.strip()
    if kind == "OK":
        ok += 1
        continue
    if kind == "FAILED":
        failed.append(rel)
        continue
    text = open(st[:-len(".status")] + ".log").read()
    for block in re.split(r"\n(?=\S[^\n]*error: static assertion failed)", text):
        if "LATHER_LAUNCH_CHECK" not in block:
            continue
        size = re.search(r"DriverBytes=(\d+)", block)
        driver = re.search(r"DriverType=Kokkos::Impl::(Parallel\w+)<(.*?), (Kokkos::(?:RangePolicy|TeamPolicy|MDRangePolicy)[^,\]]*)", block)
        site = re.findall(r"at line (\d+) of (" + re.escape(root) + r"/[^\s\"]+)", block)
        site = next(((f, l) for l, f in site if "/include/lather/" in f or "/tests/" in f or "/benchmarks/" in f), None)
        key = (driver.group(1) + " " + driver.group(2)) if driver else "(driver not parsed)"
        where = f"{os.path.relpath(site[0], root)}:{site[1]}" if site else "?"
        hits.setdefault(key, set()).add((size.group(1) if size else "?", where, rel))
print(f"launch check: {ok} units clean, {len(hits)} launch(es) not by kernel argument, {len(failed)} unit(s) failed to compile")
for key, rows in sorted(hits.items()):
    sizes = sorted({r[0] for r in rows})
    print(f"  {key[:300]}\n    driver bytes {', '.join(sizes)}; launched at {', '.join(sorted({r[1] for r in rows}))}")
for rel in failed:
    print(f"  FAILED to compile: {rel} (log kept only on failure of the check)")
sys.exit(1 if hits or failed else 0)
EOF
log "finished in $(($(date +%s) - t0)) s"
if [ "$status" -ne 0 ]; then
  for f in "$work"/*.status; do
    grep -q '^FAILED' "$f" && { log "compile log of $(cut -d' ' -f2 "$f"):"; tail -n 20 "${f%.status}.log" >&2; }
  done
fi
exit "$status"
