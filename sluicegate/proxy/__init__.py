"""``sluicegate proxy``: a reverse proxy that admits each request through the quota service.

The pieces, one concern each: ``document`` (YAML/JSON with line numbers),
``template`` (QoS key templates), ``policy`` (the policy file: classes and
classification), ``http1`` (HTTP/1.1 heads and streamed bodies), ``forward``
(what the proxy changes in heads: hop-by-hop fields, ``X-Forwarded-*``),
``upstream`` (pooled keep-alive connections), ``admission`` (check/acquire/
release through :class:`sluicegate.router.client.PartitionClient`),
``server`` (one client connection's exchanges), ``run`` (the process) and
``command`` (the CLI's options).
"""
