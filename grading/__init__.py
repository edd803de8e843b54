"""Checks, grading runs and results, grade policy, agent client, TA reports and exports."""
