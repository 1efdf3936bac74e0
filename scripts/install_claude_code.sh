#!/usr/bin/env bash
# Install the Claude Code CLI the Messages API tests drive (tests/api/test_claude_code.py): the npm
# package @anthropic-ai/claude-code at a pinned version, into a cache outside the repository
# (~/.cache/llmpool/claude-code-<version>/, or $LLMPOOL_TEST_CACHE), from the npm registry only.
# Idempotent: does nothing when that version's `claude` is already there.  Prints the binary's path.
set -euo pipefail

VERSION=2.1.328
CACHE="${LLMPOOL_TEST_CACHE:-$HOME/.cache/llmpool}"
PREFIX="$CACHE/claude-code-$VERSION"
BIN="$PREFIX/node_modules/.bin/claude"

if ! "$BIN" --version >/dev/null 2>&1; then
  if ! command -v npm >/dev/null; then
    echo "scripts/install_claude_code.sh: npm is needed (Debian's nodejs and npm packages)" >&2
    exit 1
  fi
  mkdir -p "$PREFIX"
  # The package's platform binary comes as an npm optional dependency; its postinstall (run here
  # by hand, no other install script runs) only copies that binary over the bin/ placeholder.
  npm install --prefix "$PREFIX" --no-audit --no-fund --ignore-scripts --loglevel=error \
    "@anthropic-ai/claude-code@$VERSION" >&2
  (cd "$PREFIX/node_modules/@anthropic-ai/claude-code" && node install.cjs >&2)
fi
echo "$BIN"
