"""``make demo`` (``python -m settlement.demo``): a tour of every settlement
path against a real broker and engine worker, an app built on the client
library; :mod:`settlement.demo.tour` says what it does."""
