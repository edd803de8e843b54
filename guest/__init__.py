"""The in-guest grading agent and the cloud-init that installs it."""
