"""An --out that is neither empty nor a run: `moebench sweep`, `run` and torchrun's entry
(`moebench.dist_worker`) refuse it before any work (docs/design.md, "The store")."""

from __future__ import annotations

import os

from moebench.results.lock import JOBS_FILE, LOCK_FILE
from moebench.results.sequence import SEQ_FILE
from moebench.results.store import RunStore
from moebench.results.store_read import refuse_broken_link
from moebench.results.writable import TMP_PREFIX, TMP_SUFFIX


def refuse_foreign(store: RunStore) -> None:
    """ValueError (one line, exit 2, before any work) where the run folder exists and is neither
    empty nor a run (a checkout's root, a home folder, runs/ itself): a sweep would put its rows/
    and env.json among files that are not its own. A run holds one of the names a sweep writes
    (rows/, envs/, env.json, sweep-*.json, .lock, .lock-jobs, .row-seq) and is resumed; a killed
    writer's temp file (.tmp-*.tmp) is nobody else's (docs/design.md, "The store")."""
    refuse_broken_link(store.dir)  # a link that loops or dangles: said so (not "a file stands where a folder must be")
    try:
        names = sorted(os.listdir(store.dir))
    except OSError:  # not there yet, a file, not ours to list: the probe says which, before any work
        return
    ours = {store.rows_dir.name, store.envs_dir.name, "env.json", LOCK_FILE, JOBS_FILE, SEQ_FILE}
    if any(n in ours or (n.startswith("sweep-") and n.endswith(".json")) for n in names):
        return
    theirs = [n for n in names if not (n.startswith(TMP_PREFIX) and n.endswith(TMP_SUFFIX))]
    if theirs:
        held = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise ValueError(
            f"{store.dir} is neither empty nor a moebench run (it holds {held}; a run holds rows/ and "
            "env.json): give --out a new or empty folder, or an existing run to resume"
        )
