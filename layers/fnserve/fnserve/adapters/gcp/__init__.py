"""Google Cloud Functions (Cloud Run functions): the same data plane behind functions-framework."""
