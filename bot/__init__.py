"""Greenlight's Slack transport; `__version__` is the one place the release number lives."""

__version__ = "0.1.0"
