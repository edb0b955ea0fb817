"""The engine a worker runs: the app of :mod:`streams.app` with every agent
and timer registered on it (``faust -A streams.engine worker``).

Each feature module declares its agent or timer on ``streams.app.app`` when
imported; importing them here, and nowhere in ``streams.app``, keeps the app
free of its features (and of import circles)."""

from __future__ import annotations

from streams import command_agent, idle_deleter, lock_timer, log_trimmer, metrics, scan_timer
from streams.app import app, metrics_port

__all__ = ["app", "command_agent", "idle_deleter", "lock_timer", "log_trimmer", "scan_timer"]

if metrics_port is not None:
    metrics.serve(metrics_port)
