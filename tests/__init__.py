"""The tests are packages (tests.<room>.test_x), so that two rooms may hold files of one name.
The shared helpers at this level (_require, fault_experts, batched_rules, ...) are imported by
their bare names: conftest.py puts this folder on sys.path, and on the ranks' PYTHONPATH."""
