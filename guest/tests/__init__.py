"""Tests for the guest agent and its cloud-init."""
