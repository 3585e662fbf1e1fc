"""Fixtures of the fault-injection suite: the control tests' simulated cards."""

from tests.control.conftest import sim, sim_h200  # noqa: F401 - re-exported fixtures
from tests.runs.conftest import runs_env  # noqa: F401 - re-exported fixture
