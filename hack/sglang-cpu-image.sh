#!/usr/bin/env bash
# The kind tier's engine image for the engine dry run (docs/dry-run.md): a CPU image holding one
# supported SGLang release's own code from its PyPI wheel, as a user's engine image does, so the
# dry-run pod runs that release's start-up resolution and handshake on a real kubelet. No GPU
# kernels: what SGLang's start-up path imports (the parity oracle venv's packages,
# hack/sglang-oracle-venv.sh, with the release's code from hack/sglang-release.sh in place of
# 0.5.23's), on Debian bookworm's python3 (3.11, the wheels' ABI). torch's CUDA wheel needs its
# nvidia-* libraries only to load: every one `import torch, sglang.srt.server_args` does not map is
# left out, as are compilers and headers, which takes 6 GB down to about 4.3 GB.
#
# Two tags on one image: `pd-sglang-cpu:v<release>-cpu-<key>` names its release, and
# `pd-sglang-cpu:custom-<key>` does not (a custom build whose release pd-operator cannot tell).
# Built once per key (the venv's key, the release, this script); prints both references.
#   hack/sglang-cpu-image.sh [RELEASE]     (default 0.5.22; needs a Docker engine)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RELEASE=${1:-0.5.22}
log() { echo "[sglang-cpu-image $(date +%H:%M:%S)] $*" >&2; }
# shellcheck source=hack/lib/rootfs.sh
source "$ROOT/hack/lib/rootfs.sh"

python=$(hack/sglang-oracle-venv.sh | tail -n1)
venv=$(dirname "$(dirname "$python")")
release_dir=$(hack/sglang-release.sh "$RELEASE")
key=$( { basename "$venv"; basename "$release_dir"; cat "$0" hack/image/sglang-cpu.Dockerfile; } | sha256sum | cut -c1-10)
TAGGED="pd-sglang-cpu:v$RELEASE-cpu-$key"
CUSTOM="pd-sglang-cpu:custom-$key"
if image_exists "$TAGGED" && image_exists "$CUSTOM"; then
  printf '%s\n%s\n' "$TAGGED" "$CUSTOM"; exit 0
fi
start=$(date +%s)
python_bases

# The build context: hard links into the cached trees (no copy), the release's code in place of
# the venv's 0.5.23.
stage="${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/image/sglang-cpu-stage"
rm -rf "$stage"; mkdir -p "$stage"
sp="$stage/site-packages"
cp -al "$venv"/lib/python3.11/site-packages "$sp"
rm -rf "$sp"/sglang "$sp"/sglang-*.dist-info "$sp"/pip "$sp"/pip-*.dist-info
for entry in "$release_dir"/*; do
  rm -rf "${sp:?}/$(basename "$entry")"
  cp -al "$entry" "$sp/"
done
loaded=$(PYTHONPATH="$sp" "$python" -S -c '
import torch, sglang.srt.server_args
print("\n".join(sorted({l.split()[-1].rsplit("/", 1)[-1] for l in open("/proc/self/maps") if "/nvidia/" in l})))')
[ -n "$loaded" ] || { log "FAILED: importing torch mapped no nvidia library; the venv is not what this script expects"; exit 1; }
find "$sp/nvidia" -name '*.so*' -type f | while read -r lib; do
  grep -qxF "$(basename "$lib")" <<<"$loaded" || rm -f "$lib"
done
rm -rf "$sp"/nvidia/*/include "$sp"/triton/backends/nvidia/{bin,lib} "$sp"/triton/backends/*/include "$sp"/torch/include
log "docker build $TAGGED (SGLang $RELEASE on $PY_RUNTIME, $(du -sh "$sp" | cut -f1) of packages)"
cp hack/image/sglang-cpu.Dockerfile "$stage/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q --build-arg "RUNTIME_IMAGE=$PY_RUNTIME" --build-arg "SGLANG_RELEASE=$RELEASE" \
  -t "$TAGGED" "$stage" >/dev/null
rm -rf "$stage"
got=$(docker run --rm --network none "$TAGGED" python3 -c 'import torch, sglang.srt.server_args, sglang; print(sglang.__version__)')
[ "$got" = "$RELEASE" ] || { log "FAILED: the image's SGLang says ${got:-nothing}, want $RELEASE"; docker rmi "$TAGGED" >/dev/null; exit 1; }
docker tag "$TAGGED" "$CUSTOM"
# Earlier keys' images (another venv, release or script) are 4.7 GB each: only this key's stay.
docker image ls --format '{{.Repository}}:{{.Tag}}' pd-sglang-cpu | grep -vxF -e "$TAGGED" -e "$CUSTOM" | xargs -r docker rmi >/dev/null || true
log "built in $(( $(date +%s) - start ))s: $(docker image inspect "$TAGGED" --format '{{.Size}}') bytes"
printf '%s\n%s\n' "$TAGGED" "$CUSTOM"
