"""``fnserve serve``: ``command`` (the command as a library call, and a bare serve's options from the
environment), ``serve`` (models checked, run dirs, workers, front processes), ``app`` (a front
process's app composed), ``fronts`` (the front processes and their supervisor), ``layout`` and ``starting`` (the
start-time policy), ``rundirs`` and ``inference`` (the inference workers' module)."""
