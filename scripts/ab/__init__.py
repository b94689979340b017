"""Two builds of pegaspec compared on one bench command: `python -m scripts.ab --help`."""
