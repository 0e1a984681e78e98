#!/bin/bash
# Files of numbers against `rotary generate --prompt-tokens` (issue 48): every id is read by the one rule for
# numbers in text (rotary/parse_number.h) - decimal digits only, inside the vocabulary, nothing wrapped - and the
# message quotes the bad token whole: a NUL in it (issue 48, fault 6: the message was printed cut at the NUL) is
# shown as \x00 with the bytes after it. Every bad file exits 2 naming the file, the token and its line.
#
# usage: bash test_number_files.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_number_files.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_number_files.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
if ! "$ROTARY" generate --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no generate command (built without libtorch)"
  exit 0
fi
T="timeout 60"

# ids <name> <printf format>: a token id file written byte for byte.
ids() { printf -- "$2" > "$W/$1"; }  # (-- : a content starting with "-" is no option)
generate() { $T "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/$1" --max-new 1 --no-progress; }

# ---- A NUL inside a token: the whole token, the NUL escaped, and the message goes on after it.
ids nul.txt '12 3\0x9 4\n'
expect_error "a NUL in a token id file" 2 "nul.txt: token 2 (line 1) = \"3\\x00x9\" is invalid; allowed: decimal token ids in [0, 64) separated by whitespace" -- generate nul.txt
ids nul_end.txt '12 3\0 4\n'
expect_error "a NUL ending a token" 2 "nul_end.txt: token 2 (line 1) = \"3\\x00\" is invalid; allowed: decimal token ids" -- generate nul_end.txt

# ---- Junk a hand-made parser would read as a number (or as part of one).
ids overflow.txt '1 2\n99999999999999999999\n'
expect_error "an id past 2^64" 2 "overflow.txt: token 3 (line 2) = 99999999999999999999 is invalid; allowed: decimal token ids in [0, 64)" -- generate overflow.txt
ids past_int64.txt '9223372036854775808\n'
expect_error "an id of 2^63" 2 "past_int64.txt: token 1 (line 1) = 9223372036854775808 is invalid" -- generate past_int64.txt
ids vocab.txt '1 64\n'
expect_error "an id past the vocabulary" 2 "vocab.txt: token 2 (line 1) = 64 is invalid" -- generate vocab.txt
ids exponent.txt '1e3\n'
expect_error "an exponent" 2 "exponent.txt: token 1 (line 1) = \"1e3\" is invalid" -- generate exponent.txt
ids plus.txt '1 +5\n'
expect_error "a leading +" 2 "plus.txt: token 2 (line 1) = \"+5\" is invalid" -- generate plus.txt
ids minus.txt '-1\n'
expect_error "a negative id" 2 "minus.txt: token 1 (line 1) = \"-1\" is invalid" -- generate minus.txt
ids junk.txt '7\n12abc\n'
expect_error "digits then junk" 2 "junk.txt: token 2 (line 2) = \"12abc\" is invalid" -- generate junk.txt
ids hex.txt '0x10\n'
expect_error "a hex id" 2 "hex.txt: token 1 (line 1) = \"0x10\" is invalid" -- generate hex.txt
ids escape.txt '5 \033[31m6\n'
expect_error "a terminal escape in a token" 2 "escape.txt: token 2 (line 1) = \"\\x1b[31m6\" is invalid" -- generate escape.txt

# ---- Leading zeros are decimal (010 is ten, never octal eight): the file is read and the model runs.
ids zeros.txt '010 07\n1\n'
if generate zeros.txt > "$W/zeros.out" 2> "$W/zeros.err"; then
  pass "leading zeros are decimal"
else
  fail "leading zeros: exit $? ($(head -c 300 "$W/zeros.err"))"
fi

echo "$fails failed"
[ "$fails" = 0 ]
