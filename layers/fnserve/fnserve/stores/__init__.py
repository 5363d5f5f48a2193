"""Where results, payloads, follow-ups and models are kept: ``dynamodb``, ``s3`` and ``sqs`` on AWS, ``redis``
(Memorystore, or a container server's neighbour), ``gcs`` and ``pubsub`` on Google Cloud; ``objects`` reads and
writes either bucket by its URI."""
