"""Routing: the synthetic routings and the emulated EP rank (generate.py), recorded routing's
file format (file.py), and capturing it from a model (capture.py, hf.py). docs/routing.md."""
