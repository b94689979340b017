"""An OpenAI-compatible HTTP server over one Engine (`python -m engine serve`)."""
