#!/bin/sh
# The commands of docs/guide.md's command table (rows "| `turbozero CMD ...` |") each answer
# `CMD --help` and `help CMD` with exit 0 and a "usage: turbozero CMD" line; --version too.
set -u
TZ=${1:?usage: cli_help.sh TURBOZERO GUIDE}
GUIDE=${2:?usage: cli_help.sh TURBOZERO GUIDE}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tzhelp.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; sed 's/^/    | /' "$TMP/out" | head -n 20; fail=$((fail + 1)); }

cmds=$(grep -o '^| `turbozero [a-z-]*' "$GUIDE" | awk '{print $3}' | sort -u)
[ -n "$cmds" ] || { echo "FAIL no command table in $GUIDE"; exit 1; }
for c in $cmds; do
    for form in "$c --help" "help $c"; do
        # shellcheck disable=SC2086
        if $TZ $form >"$TMP/out" 2>&1 && grep -q "^usage: turbozero $c" "$TMP/out" &&
           grep -q '^example:' "$TMP/out"; then
            ok "turbozero $form"
        else
            bad "turbozero $form: exit non-zero or no usage/example line"
        fi
    done
done
if $TZ prep text --help >"$TMP/out" 2>&1 && grep -q '^usage: turbozero prep text' "$TMP/out"; then
    ok "turbozero prep text --help"
else
    bad "turbozero prep text --help"
fi
if $TZ --version >"$TMP/out" 2>&1 && grep -q '^turbozero [0-9]' "$TMP/out" &&
   grep -q '^build: commit .*, CUDA .*, CPU kernel ' "$TMP/out"; then
    ok "turbozero --version"
else
    bad "turbozero --version"
fi
if $TZ --help >"$TMP/out" 2>&1 && grep -q 'DiT' "$TMP/out"; then
    ok "turbozero --help mentions DiT"
else
    bad "turbozero --help"
fi
if ! $TZ help no-such-command >"$TMP/out" 2>&1; then
    ok "turbozero help no-such-command fails"
else
    bad "turbozero help no-such-command exited 0"
fi
echo "cli_help: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
