#!/bin/sh
# Install what stockade's sandbox and tests use, where this machine allows it:
# bubblewrap (the bwrap backend), util-linux (prlimit, setpriv: limits and the
# jail user), git (tree()), PostgreSQL (the store's and the sinks' tests), and
# curl and a system python3 (steps in the tests and examples run them in jails),
# and a C compiler with Python's headers (the landlock backend's C launcher,
# built by pip; without them it falls back to a slower Python one), and
# chromium (the web UI's browser tests drive Debian's build through Playwright;
# Playwright's own browser download is never used).
# Without root or passwordless sudo it only says what is missing.
set -u
missing=""
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
command -v git >/dev/null 2>&1 || missing="$missing git"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
[ -x /usr/bin/python3 ] || missing="$missing python3"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
py=${PYTHON:-python3}
if command -v "$py" >/dev/null 2>&1 && ! "$py" -c \
  'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
then
  missing="$missing python3-dev"
fi
{ command -v prlimit && command -v setpriv; } >/dev/null 2>&1 || missing="$missing util-linux"
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing="$missing postgresql"
fi
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: install$missing with your package manager for the full sandbox and test suite" >&2
  exit 0
fi
if [ "$(id -u)" = 0 ]; then SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
else
  echo "note: run 'sudo apt-get install$missing' for the full sandbox and test suite" >&2
  exit 0
fi
echo "installing$missing" >&2
$SUDO apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null 2>&1 \
  || echo "warning: apt-get install$missing failed" >&2
