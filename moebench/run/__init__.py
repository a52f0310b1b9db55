"""Running combinations: the plan (plan.py), `moebench sweep`'s execution (sweep.py), the local
launcher and its ranks (launch.py, worker.py), ranks someone else starts (dist_worker.py:
torchrun, SLURM tasks via slurm.py), ranks dying with their parent (lifeline.py), the messages
between launcher and ranks (messages.py), the environment fingerprint and tree state (env.py,
treestate.py, tree_files.py) and Nsight Systems imports (nsys_import.py)."""
