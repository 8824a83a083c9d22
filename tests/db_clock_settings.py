"""Settings of a child process started by a test that moved the database clock (tests/db_clock.py).

The project settings, plus the test's clock offset (``NEXUS_TEST_DB_CLOCK_OFFSET_SECONDS``) on ``db_now()``.
"""
import os

from nexusflow.settings import *  # noqa: F403 - these settings are the project's, plus the clock below
from tests.db_clock import OFFSET_ENV, install

install(float(os.environ[OFFSET_ENV]))
