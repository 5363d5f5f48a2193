"""The InferenceService as a Lambda function builds it: S3 model fetching and the DynamoDB cache tier."""

from __future__ import annotations

from fnserve.aws.results import DynamoCacheBackend, DynamoResultStore
from fnserve.aws.s3 import fetch_model
from fnserve.core.service import InferenceService
from fnserve.core.settings import Settings


def result_store(settings: Settings) -> DynamoResultStore | None:
    """The results table's store, when one is configured."""
    if settings.results_table is None:
        return None
    return DynamoResultStore(settings.results_table, bucket=settings.results_bucket)


def build_service(settings: Settings, store: DynamoResultStore | None = None) -> InferenceService:
    """A service whose s3:// models load from S3 and whose cache shares results through DynamoDB."""
    store = store or result_store(settings)
    backend = DynamoCacheBackend(store) if store is not None else None
    return InferenceService.from_settings(settings, fetchers={"s3": fetch_model}, cache_backend=backend)
