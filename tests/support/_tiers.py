"""The tiers (tests/README.md): GPU tests run only where `-m` names gpu, and the slow tier only
where it names slow. pyproject.toml's addopts say `-m 'not gpu and not slow'`, but any other `-m`
replaces them (the quick tier's `-m "not multiprocess"`, `-m multiprocess`) and would select
both; this hook deselects them again. So the README's command runs neither, `-m slow` is exactly
the slow tier (its GPU tests aside) and `-m gpu` the GPU tests. Loaded by tests/conftest.py;
tested by tests/project/test_tiers.py."""

from __future__ import annotations

TIER_MARKERS = ("gpu", "slow")


def pytest_collection_modifyitems(config, items):
    expr = config.option.markexpr or ""
    for marker in TIER_MARKERS:
        if marker in expr:
            continue
        out = [item for item in items if item.get_closest_marker(marker)]
        if out:
            config.hook.pytest_deselected(items=out)
            items[:] = [item for item in items if not item.get_closest_marker(marker)]
