"""The worker pool: warm spawned processes that run a handler, one call at a time each.

``pool`` (the dispatcher, in the parent), ``worker`` (a worker process's main), ``messages``
(what crosses the pipe between them) and ``remote`` (model sessions that run in pool
workers).
"""
