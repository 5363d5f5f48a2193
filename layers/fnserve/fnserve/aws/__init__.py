"""AWS beside the stores: ``clients`` (boto3 clients with budgets), ``secrets`` (rotating API keys) and ``events``
(Lambda's events, context object and the local fake identities, shared by the emulator, the workers and the tests)."""
