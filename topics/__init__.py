"""Kafka topics of the settlement layer: their names, their specs and the
formats of the records the engine and the clients exchange on them.

Every topic a namespace uses is named in :mod:`topics.names`, specified in
:mod:`topics.specs` and created explicitly by :func:`topics.specs.provision`;
nothing relies on broker auto-creation.
"""
