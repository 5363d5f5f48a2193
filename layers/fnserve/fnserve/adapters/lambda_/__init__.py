"""AWS Lambda: ``http`` (API Gateway and ALB through Mangum), ``sqs`` (batch jobs), ``snapstart``."""
