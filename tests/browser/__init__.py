"""Helpers for tests and benchmarks that need a live portal: attempts driven to running on kubesim, daphne and a
Celery worker started as subprocesses, sessions for WebSocket clients."""
