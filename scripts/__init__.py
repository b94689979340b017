"""Developer tools run from a checkout; not part of the shipped package."""
