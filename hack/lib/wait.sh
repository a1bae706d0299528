# Sourced by the hack scripts that wait on something; defines functions only.
#   wait_for WHAT SECONDS CMD...  runs CMD (its output discarded) every half second until it
#                                 succeeds; after SECONDS it says what it waited for and returns 1,
#                                 so a caller under `set -e` stops there instead of going on blind.
wait_for() {
  local what=$1 timeout=$2; shift 2
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      printf '[%s %s] timed out after %ss waiting for %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$timeout" "$what" >&2
      return 1
    fi
    sleep 0.5
  done
}

#   wait_crds_established SECONDS PATH  waits for every CRD in PATH (a file or a directory) to be
#                                 Established. A CRD created a moment ago has no conditions yet,
#                                 which `kubectl wait --for=condition` reports as an error at once
#                                 instead of waiting.
crd_established() {
  [ "$(kubectl get "$1" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}')" = True ]
}
wait_crds_established() {
  local crd
  for crd in $(kubectl get -f "$2" -o name); do
    wait_for "$crd to be Established" "$1" crd_established "$crd"
  done
}
