"""Requests gathered into batches: the ``scheduler`` (a queue per model and shape, when a batch closes), its
``queues``, ``admission`` (refused at once what cannot be served in time), ``stacking`` (a batch as one call, split
back), and the ``priority`` of the threads batches run on."""
