"""What reads several apps: dashboards, health probes and metrics, above portal, labs and grading."""
