"""AWS Lambda: ``http`` (API Gateway and ALB through Mangum, over ``asgi``), ``sqs`` (batch jobs) and ``snapstart``;
the events Lambda delivers are built by :mod:`fnserve.aws.events`."""
