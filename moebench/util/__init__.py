"""Below every room: writes that never follow a link (safe_write.py), palette PNGs (pngfile.py)
and the wording every room shares (words.py: a count with its noun). Imports nothing of moebench."""
