"""The cards of moebench's own entries (kernels/entry.py): every module here is imported by
registry.discover(), none imports torch, Triton or an optional library at module level. A new
entry adds its card (in a module of this package, `@card(kind, name)`) beside its
implementation module (kernels/prepare_finalize/ or kernels/experts/)."""
