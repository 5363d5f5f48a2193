"""AWS adapters: boto3 clients, the DynamoDB result store, SQS jobs and S3 payloads."""
