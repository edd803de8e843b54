"""API endpoints, one class per endpoint, grouped by subject."""
