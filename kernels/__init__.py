"""moebench.kernels: the modular MoE layer under test (installed from ./kernels).

CONTRACT_VERSION is the version of the plugin contract (docs/plugins.md): what a package
registering experts or backends through the `moebench.kernels` entry-point group may rely
on. A plugin declares the version it was written against (`MOEBENCH_CONTRACT` in the module
its entry point names); another version disables it with that reason. Bump it when a
change to interfaces.py, knobs.py, registry.py's decorators or reference.py would break
a plugin written against the old one.

This folder is only ever `moebench.kernels`. Wherever the repository root is on `sys.path`
(pytest's rootdir, `python -m` from the root), `import kernels` finds it first; it then stands
aside for the installed top-level `kernels` distribution (Hugging Face's, which transformers
imports), or fails as a missing module would (docs/design.md, "The rooms").
"""
CONTRACT_VERSION = 1

if __name__ == "kernels":  # found as a top-level package: never this folder's name
    from ._shadow import stand_aside

    stand_aside(__file__)
