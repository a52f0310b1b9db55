"""The tests are packages (tests.<room>.test_x), so that two rooms may hold files of one name.
The shared helpers in support/ (_require, fault_experts, batched_rules, ...) are imported by their
bare names: conftest.py puts that folder (not this one, whose room folders would shadow installed
packages such as Hugging Face's `kernels`) on sys.path, and on the ranks' PYTHONPATH."""
