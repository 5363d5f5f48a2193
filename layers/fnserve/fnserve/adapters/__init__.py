"""The transports, each translating its wire to the data plane and back and deciding nothing about inference:
``http`` (ASGI: V2, results, SageMaker), ``grpc`` (OIP), ``lambda_`` (API Gateway and SQS handlers) and ``gcp``
(Cloud Functions)."""
