#!/usr/bin/env bash
# Builds the kind tier's model image: weights as an OCI image for a `spec.model.source.image`
# (a Kubernetes image volume). Nothing in it runs; under `model/` it holds a real config.json
# (DeepSeek-V3's, tests/parity/configs), a tokenizer file and one weight shard, as a model image
# built for image volumes does. Tagged by its content, built once; prints its reference.
# Needs a Docker engine: eval "$(hack/docker.sh up)".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIG="$ROOT/tests/parity/configs/DeepseekV3ForCausalLM.json"
SHARD_BYTES=$((4 << 20))
tag=$( { cat "$CONFIG" "$0"; } | sha256sum | cut -c1-12)
MODEL_IMAGE="pd-model-dsv3:$tag"
if ! docker image inspect "$MODEL_IMAGE" >/dev/null 2>&1; then
  d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
  mkdir -p "$d/model"
  cp "$CONFIG" "$d/model/config.json"
  printf '{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}\n' >"$d/model/tokenizer.json"
  head -c "$SHARD_BYTES" /dev/zero >"$d/model/model-00001-of-00001.safetensors"
  chmod -R a+rX "$d/model"
  tar -C "$d" --owner=0 --group=0 --numeric-owner -c model \
    | docker import --change 'LABEL org.opencontainers.image.description="pd-operator kind tier: DeepSeek-V3 config.json, a tokenizer and one shard"' - "$MODEL_IMAGE" >/dev/null
fi
echo "$MODEL_IMAGE"
