"""The settlement engine: a Faust app that owns locks and settlement outcomes.

``streams.app`` builds the app and ``streams.engine`` registers its agents
and timers on it (``faust -A streams.engine worker``); the command
agent lives in ``streams.command_agent``, the lock-expiry timer in
``streams.lock_timer`` and the state machine, free of Faust, in
``streams.window``.
"""
