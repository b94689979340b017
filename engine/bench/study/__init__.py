"""The 4B-geometry lever study: `python -m engine.bench study` (run.py), its report rebuilt from its
files (files.py) and the cost model's in-sample refit (refit.py)."""
