"""What a run writes and how it is read: one row's columns, statuses and verdicts (row.py), a rank's
results and a combination's (rank_result.py), rows from them (rows.py), the run folder's store,
its lock and its migrations (store.py, lock.py, migrate.py), the work left and the rows of a
finished combination (finished.py), environment errors (writable.py) and synthetic runs for
tests (synthetic.py). Every reader and writer of a run folder goes through store.py."""
