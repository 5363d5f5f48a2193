"""A request run: a model or pipeline as a ``servable``, its ``pipeline`` of ``steps``, the texts ``embeddings``
count and cut, the result ``cache``, the ``runner`` of closed batches (their ``stacking``, a failure isolated), and
the ``service`` in front of them all."""
