# The CI run's time limit, checked before each stage (sourced by .ci/run,
# tools/test.sh and tools/sanitizers.sh). .ci/run sets KVSERVE_CI_DEADLINE,
# the epoch second its run must end by (its start + KVSERVE_CI_LIMIT_S,
# default 5400: CI's 90 minutes). Without it (a local run) nothing is
# checked.

# Typical seconds of each stage on CI's 2-core machine (docs/CI.md), with
# about 15% of room.
declare -A CI_STAGE_S=([fresh-root]=320 [main]=510 [asan]=1550 [fuzz]=280
                       [tidy]=320 [tsan]=310)

# ci_budget_check STAGE [LATER_STAGE...]: exits 3, naming STAGE, when what is
# left of the run is less than the typical time of STAGE and those after
# it: a run on course to pass its limit stops at once, saying where.
ci_budget_check() {
  [ -n "${KVSERVE_CI_DEADLINE:-}" ] || return 0
  local need=0 s left
  for s in "$@"; do need=$((need + ${CI_STAGE_S[$s]:-0})); done
  left=$((KVSERVE_CI_DEADLINE - $(date +%s)))
  if [ "$left" -lt "$need" ]; then
    echo "ci: stopping before stage '$1': it and the stages after it" \
      "($*) take about $need s, and $left s are left of the run's" \
      "limit" >&2
    exit 3
  fi
}
