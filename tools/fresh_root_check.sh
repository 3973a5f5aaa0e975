#!/usr/bin/env bash
# Proves the README's first command on a machine that has nothing: builds a
# minimal Debian 12 root (debootstrap --variant=minbase, from the Debian
# mirror this machine's apt configuration names), clones the checkout's
# committed HEAD into it, and runs there, under chroot and with an empty
# environment:
#   1. the README's command (setup, configure, build kvserve), read from
#      README.md itself so the two cannot drift apart;
#   2. `kvserve generate` on the default model, greedy, "The capital of
#      France is": the continuation must start with " Paris";
#   3. the daemon as the README starts it: it must log its listening line
#      (the seconds it took are printed).
# From the host the root receives only what any machine of this network has
# before setup runs: its resolver, its apt sources and its locally installed
# CA certificates (the egress proxy's). Nothing installed here leaks in.
#
#   tools/fresh_root_check.sh        (root; KEEP_FRESH_ROOT=1 keeps the root)
#
# FRESH_ROOT_SHARE_CCACHE=1 (CI sets it): once the check passes, the root's
# compiler cache is added to this machine's, so the main build that follows
# reuses the objects it can (the project keys ccache on relative paths).
# Only the cache goes out; nothing comes in.
#
# Prints each step's name and time; on failure, which step failed. The
# mounts are removed on every exit path before the root is deleted.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${FRESH_ROOT_DIR:-$ROOT/build-fresh-root}"
R="$WORK/root"
SUITE=bookworm
START=$SECONDS
MOUNTS=()

say() { echo "fresh-root: $*"; }
die() {
  say "FAILED at step '$1' after $((SECONDS - START)) s${2:+: $2}" >&2
  exit 1
}

# The first Debian mirror in this machine's apt sources (deb822 or one-line).
debian_mirror() {
  local uri=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    uri="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' \
      /etc/apt/sources.list.d/*.sources)"
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri="$(awk '$1 == "deb" && $0 !~ /security/ {
      for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
      /etc/apt/sources.list)"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# Ends what still runs inside the root, then unmounts in reverse order.
# The root is deleted only when nothing is mounted under it any more.
cleanup() {
  local rc=$?
  if [ -d "$R" ]; then
    local p
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/root" 2>/dev/null)" = "$R" ] &&
        kill -9 "${p#/proc/}" 2>/dev/null
    done
  fi
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null
  done
  if [ -d "$R" ] && findmnt -rn -o TARGET | grep -q "^$R"; then
    say "mounts remain under $R; not deleting it" >&2
    rc=1
  elif [ "${KEEP_FRESH_ROOT:-0}" != 1 ]; then
    rm -rf --one-file-system "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME COMMAND...: runs COMMAND, fails the check naming NAME.
step() {
  local name="$1" t=$SECONDS
  shift
  say "--- $name"
  "$@" || die "$name" "exit $?"
  say "    $name: $((SECONDS - t)) s"
}

# In the root: no variable of this machine's environment, as on a new one.
in_root() {
  chroot "$R" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /src && $1"
}

[ "$(id -u)" = 0 ] || die "preflight" "needs root (debootstrap, chroot, mount)"
readme_cmd="$(grep -m1 -E '^    deploy/setup.sh && ' "$ROOT/README.md" |
  sed -e 's/^ *//')"
[ -n "$readme_cmd" ] || die "preflight" "README.md has no '    deploy/setup.sh && ...' line"
build_cmd="${readme_cmd% && build/server/kvserve *}"
serve_cmd="${readme_cmd##* && }"
case "$serve_cmd" in build/server/kvserve\ *) ;;
  *) die "preflight" "README's command does not end by starting build/server/kvserve" ;;
esac

install_debootstrap() {
  command -v debootstrap >/dev/null && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends debootstrap
}
step "debootstrap on this machine" install_debootstrap

mirror="$(debian_mirror)"
{ rm -rf --one-file-system "$WORK" && mkdir -p "$WORK"; } ||
  die "prepare" "cannot make $WORK"
make_root() {
  debootstrap --variant=minbase "$SUITE" "$R" "$mirror" \
    >"$WORK/debootstrap.log" 2>&1 && return 0
  tail -n 30 "$WORK/debootstrap.log"
  return 1
}
step "debootstrap --variant=minbase $SUITE $mirror" make_root

prepare_root() {
  cp /etc/resolv.conf "$R/etc/resolv.conf" || return 1
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    rm -f "$R/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/*.sources "$R/etc/apt/sources.list.d/" ||
      return 1
  fi
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$R/usr/local/share/ca-certificates" &&
      cp /usr/local/share/ca-certificates/*.crt \
        "$R/usr/local/share/ca-certificates/" || return 1
  fi
  local m
  for m in proc dev dev/pts; do
    case "$m" in
      proc) mount -t proc proc "$R/proc" ;;
      *) mount --bind "/$m" "$R/$m" ;;
    esac || return 1
    MOUNTS+=("$R/$m")
  done
  git clone -q "$ROOT" "$R/src"
}
step "prepare the root (resolver, apt sources, CA certificates, mounts, clone of HEAD)" \
  prepare_root

# The README's command, its output in a log (apt and the build are long);
# the log's tail is printed when it fails.
run_readme() {
  local rc=0
  in_root "$build_cmd" >"$WORK/readme.log" 2>&1 || rc=$?
  grep -E '^setup: ' "$WORK/readme.log" | sed 's/^/    /'
  [ "$rc" = 0 ] && return 0
  tail -n 60 "$WORK/readme.log"
  return 1
}
step "README: $build_cmd" run_readme

check_paris() {
  local out
  out="$(in_root "build/server/kvserve generate --model smollm2-135m \
--no-chat --temperature 0 --max-tokens 8 --prompt 'The capital of France is'" \
    2>"$WORK/generate.log")" || { cat "$WORK/generate.log"; return 1; }
  say "    generated: '$out'"
  case "$out" in " Paris"*) return 0 ;; esac
  say "    the continuation does not start with ' Paris'" >&2
  return 1
}
step "kvserve generate: 'The capital of France is' -> ' Paris...'" check_paris

# The daemon as the README starts it, on free ports (the defaults may be
# taken on this machine); done once its listening line appears.
check_listens() {
  local log="$R/tmp/serve.log" t0 i
  t0="$(date +%s.%N)"
  in_root "exec $serve_cmd --port 0 --metrics-port 0" >"$log" 2>&1 &
  local pid=$!
  for ((i = 0; i < 600; i++)); do
    if grep -q "kvserve: listening" "$log"; then
      say "    $(grep -m1 'kvserve: listening' "$log")"
      say "    start to listening: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
      kill -TERM "$pid" 2>/dev/null
      wait "$pid"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log"
  return 1
}
step "README: $serve_cmd (until it listens)" check_listens

# The root's ccache into this machine's (files it has already are kept).
share_ccache() {
  local from="$R/root/.cache/ccache" to
  [ -d "$from" ] || { say "    the root has no compiler cache"; return 0; }
  to="$(ccache -k cache_dir 2>/dev/null ||
    echo "${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}")"
  mkdir -p "$to" && cp -an "$from/." "$to/" &&
    say "    $(du -sh "$from" | cut -f1) of compiled objects added to $to"
}
if [ "${FRESH_ROOT_SHARE_CCACHE:-0}" = 1 ]; then
  step "share the root's compiler cache" share_ccache
fi

say "passed in $((SECONDS - START)) s"
