"""What a combination is and how it is asked for: the Hydra groups' typed schema (schema.py),
composing overrides into one config and a `Combo` (compose.py), the frozen combination spec
and `Combination` (spec.py), sweep files (sweeps.py), the validity rules and which timing runs
(validity.py), what the harness says of plugins (plugins.py) and where files live (paths.py).
Imports kernels (the registry's entries and knobs) and util only."""
