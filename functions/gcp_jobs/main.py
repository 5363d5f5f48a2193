"""Batch job function on Google Cloud: Pub/Sub jobs (and cascade follow-ups) -> gathered, vectorised
inference -> results in Redis (Memorystore). The same job format and semantics as the SQS function."""

import functions_framework.aio

from fnserve.adapters.gcp.jobs import create_function

# Built once per instance at import: settings, warm model registry, result store.
jobs = functions_framework.aio.cloud_event(create_function())
