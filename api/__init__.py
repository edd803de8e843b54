"""The portal's REST API (``/api/v1/``), its error format, rate limits and the login guard."""
