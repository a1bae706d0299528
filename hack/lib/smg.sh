# The pinned SGLang model gateway: one place, src/api/lib.rs's DEFAULT_ROUTER_IMAGE
# ("pd-operator-gateway:smg-<version>"); the venv, the gateway image and the tests read it here.
# Source it; sets SMG_IMAGE and SMG_VERSION.
_smg_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SMG_IMAGE=$(sed -n 's/^pub const DEFAULT_ROUTER_IMAGE: &str = "\(.*\)";$/\1/p' "$_smg_root/src/api/lib.rs")
SMG_VERSION=${SMG_IMAGE##*:smg-}
if [ -z "$SMG_IMAGE" ] || [ "$SMG_VERSION" = "$SMG_IMAGE" ]; then
  echo "hack/lib/smg.sh: cannot read DEFAULT_ROUTER_IMAGE (name:smg-<version>) from src/api/lib.rs" >&2
  exit 1
fi
unset _smg_root
