"""Spark over the engine's topics: monitoring, the dashboard, replay and audit.

* ``source``: Kafka topics as a stream or a batch, through Spark's ``kafka``
  connector;
* ``records``: the engine's event and state records as columns;
* ``monitor`` + ``metrics_store``: the streaming metrics job and its Parquet sink;
* ``dashboard`` + ``charts``: the page over that sink (no Spark needed);
* ``audit`` and ``replay``: batch jobs over the raw logs and the events;
* ``session``: the jobs' SparkSession, local or on a cluster (Java 17 required);
  ``cli``: the commands.
"""
