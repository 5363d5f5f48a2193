"""The composition root: settings -> stores -> service -> data plane, for every way fnserve runs.

Lambda functions, the server's front processes and its inference workers all build their
objects here, once per process (warm globals). This is the one module that knows both the
core and the AWS stores; the core takes explicit arguments and reads no environment.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from fnserve.aws.clients import Budget
from fnserve.core.errors import ConfigError
from fnserve.core.execution.cache import CircuitBreaker, ResultCache
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.results import ResultStore
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.registry import ModelRegistry

# Every process builds here: its fnserve loggers write through this one's handler, in its structured lines.
from fnserve.observability import logs  # noqa: F401
from fnserve.settings import AwsSettings, Settings
from fnserve.stores import objects
from fnserve.stores.dynamodb import DynamoCacheBackend, DynamoResultStore
from fnserve.stores.manifests import fetch_manifest
from fnserve.stores.redis import RedisCacheBackend, RedisResultStore

# Cascades, follow-ups and the job processor are imported where a process has them: an API function's cold start
# pays for none of them.
if TYPE_CHECKING:
    from collections.abc import Callable

    from fnserve.core.batching.scheduler import BatchObservers
    from fnserve.core.jobs.cascade import CascadeRunner
    from fnserve.core.jobs.followups import FollowupIds, ResultLookup
    from fnserve.core.jobs.processor import JobProcessor
    from fnserve.core.serving.dataplane import DataPlane
    from fnserve.workers.pool import WorkerPool
    from fnserve.workers.remote import Overflow, Pools


Store = DynamoResultStore | RedisResultStore


def result_store(settings: AwsSettings, *, for_requests: bool = False) -> Store | None:
    """The store of results and the shared cache tier, when one is configured: Redis (FNSERVE_RESULTS)
    or the DynamoDB table (FNSERVE_RESULTS_TABLE).

    ``for_requests``: the store of a process that answers requests (the cache tier, result
    lookups), whose every call is bounded by the request budget; a batch function's store
    may wait longer rather than fail its records.
    """
    if settings.results is not None:
        if settings.results_table is not None:
            raise ConfigError("set FNSERVE_RESULTS (Redis) or FNSERVE_RESULTS_TABLE (DynamoDB), not both")
        bucket = settings.results_bucket
        return RedisResultStore.from_url(
            settings.results,
            socket_timeout=settings.request_store_timeout_seconds if for_requests else None,
            payload_sink=(lambda key, data: objects.put_bytes(bucket, f"fnserve/results/{key.replace('#', '/')}", data))
            if bucket
            else None,
            payload_source=objects.get_bytes,
        )
    if settings.results_table is None:
        return None
    if not for_requests:
        return DynamoResultStore(settings.results_table, bucket=settings.results_bucket)
    timeout, attempts = settings.request_store_timeout_seconds, settings.request_store_attempts
    return DynamoResultStore(
        settings.results_table,
        bucket=settings.results_bucket,
        budget=Budget(connect_timeout=timeout, read_timeout=timeout, max_attempts=attempts),
        max_attempts=attempts,
        base_delay=timeout / 10,
        max_delay=timeout / 4,
    )


def build_service(
    settings: Settings, store: Store | None = None, pool: WorkerPool | Overflow | Pools | None = None
) -> InferenceService:
    """The service a process serves with: models from the manifest (s3:// and gs:// ones fetched from
    their bucket), in this process, or in ``pool``'s workers (a GPU pool overflowing to CPU workers; or the
    manifest's worker groups, the other models in this process); a
    result cache whose shared tier is ``store``'s table.

    A manifest at an s3:// or gs:// URI is fetched first; its relative model paths then name
    objects beside it in the same bucket.
    """
    settings = with_local_manifest(settings)
    manifest = load_manifest(settings.manifest)
    if settings.worker_group is not None:  # a worker of a group: its models alone
        manifest = manifest.holding(settings.worker_group)
    options: dict[str, Any] = {
        "workers": settings.inference_processes,
        "intra_op_threads": settings.intra_op_threads,
        "cache_dir": settings.model_cache_dir,
        "fetchers": {scheme: objects.fetch_model for scheme in objects.SCHEMES},
        "cpu_only": settings.device == "cpu",
    }
    if pool is None:
        registry = ModelRegistry(manifest, **options)
    else:
        from fnserve.workers.remote import PlacedRegistry, PooledRegistry, Pools

        if isinstance(pool, Pools):  # the manifest's worker groups; the other models in this process
            registry = PlacedRegistry(manifest, pool, **options)
            registry.load_all()
        else:
            registry = PooledRegistry(manifest, pool)
    backend: DynamoCacheBackend | RedisCacheBackend | None = None
    if isinstance(store, RedisResultStore):
        backend, where = RedisCacheBackend(store), store.where
    else:
        backend = DynamoCacheBackend(store) if store is not None else None
        where = f"DynamoDB table {settings.results_table}"
    breaker = CircuitBreaker(
        f"the result cache's {where}",
        failures=settings.cache_breaker_failures,
        cooldown=settings.cache_breaker_cooldown_seconds,
    )
    service = InferenceService(registry, ResultCache(settings.cache_max_bytes, backend, breaker))
    if settings.eager_load and pool is None:
        service.load_all()  # its pipelines too: a missing tokenizer stops the start, as a missing model file does
    return service


def build_dataplane(
    settings: Settings,
    *,
    service: InferenceService | None = None,
    store: Store | None = None,
    batching: bool = False,
    offload: bool = False,
    observers: Callable[[str], BatchObservers] | None = None,
) -> DataPlane:
    """The data plane of a process: the service, its cascades (follow-ups through SQS) and stored results.

    Without ``service`` and ``store``, both are built from the settings. ``observers``: what each model's batcher
    tells (the server's metrics), by model name.
    """
    from fnserve.core.serving.dataplane import DataPlane  # and asyncio: not on the batch functions' path

    if store is None and service is None:
        store = result_store(settings, for_requests=True)
    service = service or build_service(settings, store)
    # One signer for the cascades and the results they are looked up by (its key may be a secret to read).
    ids = followup_ids(settings) if service.registry.manifest.cascades or store is not None else None
    return DataPlane(
        service,
        cascades=cascade_runner(settings, service, ids),
        results=result_lookup(settings, service, store, ids),
        batching=batching,
        max_concurrent_batches=max(1, settings.parallel_workers),
        offload=offload,
        observers=observers,
        request_timeout=settings.request_timeout_seconds,
    )


def with_local_manifest(settings: Settings) -> Settings:
    """The settings with an s3:// or gs:// manifest fetched to a local file (its relative model paths made
    URIs in the same bucket)."""
    if not settings.manifest.startswith(tuple(f"{scheme}://" for scheme in objects.SCHEMES)):
        return settings
    return settings.replace(manifest=str(fetch_manifest(settings.manifest, settings.model_cache_dir)))


def followup_ids(settings: AwsSettings) -> FollowupIds:
    """The signer of follow-up ids: FNSERVE_RESULT_ID_KEY, else the secret FNSERVE_RESULT_ID_KEY_SECRET names,
    else a key derived from the table's name (or the Redis URL's host part)."""
    from fnserve.core.jobs.followups import FollowupIds

    if settings.result_id_key is not None:
        return FollowupIds(settings.result_id_key.get_secret_value().encode())
    if settings.result_id_key_secret:
        from fnserve.aws.secrets import rotating_keys

        return FollowupIds(rotating_keys(settings.result_id_key_secret))
    where = settings.results_table or (settings.results or "").split("@")[-1]
    return FollowupIds(hashlib.sha256(f"fnserve-result-ids:{where}".encode()).digest())


def cascade_runner(
    settings: Settings, service: InferenceService, ids: FollowupIds | None = None
) -> CascadeRunner | None:
    """The manifest's cascades with a follow-up sender (SQS or Pub/Sub), or None when it declares none."""
    if not service.registry.manifest.cascades:
        return None
    from fnserve.core.jobs.cascade import CascadeRunner
    from fnserve.stores.followups import Followups

    destination = settings.followup_topic or settings.followup_queue_url
    return CascadeRunner(service, ids or followup_ids(settings), Followups(settings.results_bucket), destination)


def result_lookup(
    settings: AwsSettings, service: InferenceService, store: ResultStore | None, ids: FollowupIds | None = None
) -> ResultLookup | None:
    """Result ids -> states, reading ``store``; None where no results are stored."""
    if store is None:
        return None
    from fnserve.core.jobs.followups import ResultLookup

    cascades = {c.name: c for c in service.registry.manifest.cascades}
    return ResultLookup(store, ids or followup_ids(settings), cascades)


def batch_processor(settings: Settings, service: InferenceService | None, store: ResultStore | None) -> JobProcessor:
    """The job processor of a batch function (SQS or Pub/Sub), with the configured store unless ``store``
    is given; a function with nowhere to write its results is a configuration error."""
    configured = result_store(settings)
    store = store or configured
    if store is None:
        raise ConfigError(
            "a batch function needs FNSERVE_RESULTS (a Redis URL: Memorystore) or FNSERVE_RESULTS_TABLE "
            "(DynamoDB): where its results are written"
        )
    return job_processor(settings, store, service or build_service(settings, configured))


def job_processor(settings: AwsSettings, store: ResultStore, service: InferenceService) -> JobProcessor:
    """The batch job processor of the SQS and Pub/Sub functions: inputs by reference come from S3 or GCS."""
    from fnserve.core.jobs.processor import JobProcessor

    return JobProcessor(
        service,
        store,
        ttl_seconds=settings.result_ttl_seconds,
        load_payload=objects.get_bytes,
        max_receive_count=settings.max_receive_count,
    )
