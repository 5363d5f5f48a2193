"""Work that outlives a request: job ``messages``, the ``processor`` of a delivery of jobs, their ``results``,
``cascade`` runs (a fast model now, a slow one later) and their ``followups``."""
