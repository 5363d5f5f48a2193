"""``fnserve serve``: ``serve`` (the entry: models checked, run dirs, workers, front processes), ``app`` (a front
process's app composed), ``fronts`` (the front processes and their supervisor), ``layout`` and ``starting`` (the
start-time policy), ``rundirs`` and ``inference`` (the inference workers' module)."""
