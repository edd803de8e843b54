"""The portal's settings with a console lease long enough that a lease left behind outlives a test's waits, for the
daphne processes of console tests (in the test process itself, the ``settings`` fixture does the same)."""

from portal.settings import *  # noqa: F403

# Renewed every third of it (8 s), below the 10 s a viewer's registration lasts between renewals.
CONSOLE_LEASE_TTL_SECONDS = 24.0
