"""The inference core, no AWS or web imports, in rooms each importing only those below it (``tests/unit/
test_layers.py`` holds them to it): ``models`` (the manifest and its models loaded), ``codec`` (V2 tensors in and
out, checked), ``execution`` (a model or pipeline run, the service in front of them, the result cache),
``batching`` (requests gathered into batches), ``jobs`` (jobs, their results, cascades and their follow-ups),
``serving`` (the data plane every transport calls). Beneath them all: ``errors`` and ``host`` (the machine's CPUs
and the process's heap)."""
