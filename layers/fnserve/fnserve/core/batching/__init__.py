"""Requests gathered into batches: the ``scheduler`` (a queue per model and shape, when a batch closes), its
``queues``, ``admission`` (refused at once what cannot be served in time), and the ``priority`` of the threads
batches run on. What runs a closed batch is :mod:`fnserve.core.execution.runner`'s."""
