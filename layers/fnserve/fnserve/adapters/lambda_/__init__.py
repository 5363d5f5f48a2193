"""AWS Lambda: ``http`` (API Gateway and ALB through Mangum), ``sqs`` (batch jobs), ``snapstart``, and ``events``
(the shapes Lambda delivers: events, the context object)."""
