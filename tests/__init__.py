"""Test support shared across apps (not collected: see ``testpaths``)."""
