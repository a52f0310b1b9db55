"""moebench.kernels: the modular MoE layer under test.

CONTRACT_VERSION is the version of the plugin contract (docs/plugins.md): what a package
registering experts or backends through the `moebench.kernels` entry-point group may rely
on. A plugin declares the version it was written against (`MOEBENCH_CONTRACT` in the module
its entry point names); another version disables it with that reason. Bump it when a
change to interfaces.py, knobs.py, registry.py's decorators or reference.py would break
a plugin written against the old one.
"""

CONTRACT_VERSION = 1
