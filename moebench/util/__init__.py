"""Below every room: writes that never follow a link (safe_write.py), palette PNGs (pngfile.py),
the wording every room shares (words.py: a count with its noun) and argparse's refusals as one
line, for every command line (arg_errors.py). Imports nothing of moebench."""
