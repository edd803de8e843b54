"""Benchmarks of the portal, each a module printing one JSON object with its figures and its baseline measured
side by side in the same run. ``python -m bench`` (``make bench``) runs them all; see ``bench/__main__.py``."""
