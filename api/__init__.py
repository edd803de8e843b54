"""The portal's REST API (``/api/v1/``), its error format and rate limits."""
