"""Batch inference function: SQS jobs -> one vectorised inference per model -> results in DynamoDB."""

from fnserve.adapters.lambda_.sqs import create_handler

# Built once per container at import: settings, warm model registry, result store.
handler = create_handler()
