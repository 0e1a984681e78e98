# tests/cli/cli_helpers.sh: what the CLI test scripts share (sourced, not a test: ctest runs tests/cli/test_*.sh).
# Expects $W (a scratch directory) and defines fails, fail, pass and expect_error.
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# expect_error <what> <exit code> <text the message must hold> -- command...
expect_error() {
  local what=$1 code=$2 text=$3
  shift 4
  "$@" > "$W/err.out" 2> "$W/err.txt"
  local got=$?
  if [ "$got" != "$code" ]; then
    fail "$what: exit $got, expected $code ($(head -c 300 "$W/err.txt"))"
  elif ! grep -qF -- "$text" "$W/err.txt"; then
    fail "$what: message lacks '$text': $(head -c 300 "$W/err.txt")"
  else
    pass "$what"
  fi
}
