"""The InferenceService as a Lambda function builds it: S3 model fetching and the DynamoDB cache tier."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

from fnserve.aws.queue import SqsFollowups
from fnserve.aws.results import DynamoCacheBackend, DynamoResultStore
from fnserve.aws.s3 import fetch_model, get_bytes, split_uri
from fnserve.core.cascade import CascadeRunner, FollowupIds
from fnserve.core.service import InferenceService
from fnserve.core.settings import Settings


def result_store(settings: Settings) -> DynamoResultStore | None:
    """The results table's store, when one is configured."""
    if settings.results_table is None:
        return None
    return DynamoResultStore(settings.results_table, bucket=settings.results_bucket)


def build_service(settings: Settings, store: DynamoResultStore | None = None) -> InferenceService:
    """A service whose s3:// models load from S3 and whose cache shares results through DynamoDB.

    A manifest at an s3:// URI is fetched first; its relative model paths then name objects
    beside it in the same bucket.
    """
    store = store or result_store(settings)
    return InferenceService.from_settings(
        with_local_manifest(settings), fetchers={"s3": fetch_model}, cache_backend=cache_backend(store)
    )


def cache_backend(store: DynamoResultStore | None) -> DynamoCacheBackend | None:
    """The shared (DynamoDB) tier of the result cache, when there is a results table."""
    return DynamoCacheBackend(store) if store is not None else None


def with_local_manifest(settings: Settings) -> Settings:
    """The settings with an s3:// manifest fetched to a local file (its relative model paths made s3:// URIs)."""
    if not settings.manifest.startswith("s3://"):
        return settings
    return settings.model_copy(update={"manifest": str(_fetch_manifest(settings))})


def _fetch_manifest(settings: Settings) -> Path:
    bucket, key = split_uri(settings.manifest)
    prefix = key.rpartition("/")[0]
    manifest = tomllib.loads(get_bytes(settings.manifest).decode())
    for model in manifest.get("models", []):
        path = str(model.get("path", ""))
        if "://" not in path and not path.startswith("/"):
            model["path"] = f"s3://{bucket}/{prefix + '/' if prefix else ''}{path}"
    target = settings.model_cache_dir / "manifest.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest))
    return target


def followup_ids(settings: Settings) -> FollowupIds:
    """The signer of follow-up ids: FNSERVE_RESULT_ID_KEY, else a key derived from the table name."""
    if settings.result_id_key is not None:
        return FollowupIds(settings.result_id_key.get_secret_value().encode())
    return FollowupIds(hashlib.sha256(f"fnserve-result-ids:{settings.results_table}".encode()).digest())


def cascade_runner(settings: Settings, service: InferenceService) -> CascadeRunner | None:
    """The manifest's cascades with an SQS follow-up sender, or None when it declares none."""
    if not service.registry.manifest.cascades:
        return None
    return CascadeRunner(
        service, followup_ids(settings), SqsFollowups(settings.results_bucket), settings.followup_queue_url
    )
