"""Below every room: writes that never follow a link (safe_write.py) and palette PNGs
(pngfile.py). Imports nothing of moebench."""
