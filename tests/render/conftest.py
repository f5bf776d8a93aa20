"""Fixtures of the render tests; the synthetic traces live in render_fixtures."""

from render_fixtures import hostile_profile  # noqa: F401  (a fixture)
