"""Cascade follow-up function: the slow model's answers, from the follow-up queue into the results table.

A follow-up is an ordinary job for the slow model, so this is the batch function's handler.
"""

from fnserve.adapters.lambda_.sqs import create_handler

# Built once per container at import: settings, warm model registry, result store.
handler = create_handler()
