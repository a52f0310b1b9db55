"""`moebench tune`: Triton tile search (search.py) and the best combination per
token count of a results run (best.py)."""
