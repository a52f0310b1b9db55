#!/usr/bin/env bash
# Record which code a run measures where the tree travels without its .git (a GPU machine
# gets a copy of the working tree): the commit, whether the files differed from it and a
# digest of the difference, with every file's hash, in .moebench-tree.json. moebench reads
# it where there is no .git and rehashes the files, so a change after the stamp shows too
# (moebench/run/treestate.py; docs/design.md, "What a run writes").
#
#   scripts/copy_tree.sh DEST      copy the checkout's tracked and untracked-not-ignored files
#                                  to DEST (a new or empty folder) with DEST/.moebench-tree.json
#   scripts/copy_tree.sh --stamp   write .moebench-tree.json at the checkout's root, in place
#
# The checkout is the one holding the current folder. .moebench-tree.json is git-ignored:
# a GPU call's working-tree copy takes it only when its carry names it.
set -euo pipefail

usage() { echo "usage: scripts/copy_tree.sh DEST | --stamp" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in
    --stamp) action=(stamp) ;;
    -*) usage ;;
    /*) action=(copy "$1") ;;
    *) action=(copy "$PWD/$1") ;;
esac
# no optional locks (as moebench/run/treestate.py): a `git commit` in the checkout meanwhile must not fail
export GIT_OPTIONAL_LOCKS=0
repo="$(git rev-parse --show-toplevel 2>/dev/null)" || {
    echo "copy_tree.sh: $(pwd) is not in a git checkout" >&2; exit 2; }
# this script's own moebench does the hashing (standard library only: no torch needed); run
# from its folder, since `python -m` puts the current folder first on the path
code="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$code"
PYTHONPATH="$code${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m moebench.run.treestate "${action[@]}" --root "$repo"
