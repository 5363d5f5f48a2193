"""Execution providers: the manifest's choice of CUDA, TensorRT or CPU, made into ONNX Runtime's, and checked.

A model lists its providers in order of preference, each a name or a table of options
(:class:`~fnserve.core.models.manifest.providers.CudaProvider`,
:class:`~fnserve.core.models.manifest.providers.TensorrtProvider`).
ONNX Runtime quietly runs a session on the CPU when a GPU provider cannot be created (it
prints "EP Error ... Falling back"): :func:`check` turns that into a :class:`ModelLoadError`
with the reason, unless the model opts into ``cpu_fallback``, when it becomes a warning and
the model's metadata says so. Never a silent fall back.

``cpu_only`` (a process's ``FNSERVE_DEVICE=cpu``) runs every model on its CPU providers alone (the
CPU workers of a mixed-device pool): that is a placement, not a fall back.

CUDA's, cuDNN's and TensorRT's libraries installed by pip are loaded before a session asks for them
(:func:`preload_cuda`, :func:`preload_tensorrt`): the dynamic loader does not look in site-packages.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from fnserve.core.errors import ModelLoadError
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.manifest.providers import CudaProvider, Provider, TensorrtProvider

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = frozenset({CUDA, TENSORRT})

OrtProvider = str | tuple[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a session runs: the providers ONNX Runtime registered, its device, and a fall back's reason."""

    providers: tuple[str, ...]
    device: str  # "cuda:0", or "cpu"
    fallback: str | None = None  # why a GPU provider asked for is not among them (cpu_fallback = true)
    group: str | None = None  # the manifest's worker group that runs it, and its workers (None: not in one)
    workers: int | None = None

    def to_metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"providers": list(self.providers), "device": self.device}
        if self.fallback is not None:
            meta["cpu_fallback"] = self.fallback
        if self.group is not None:
            meta |= {"worker_group": self.group, "workers": self.workers}
        return meta


def name_of(provider: Provider) -> str:
    return provider if isinstance(provider, str) else provider.name


def requested(settings: ModelSettings, cpu_only: bool = False) -> list[Provider]:
    """The providers this process should ask for: the manifest's, or its CPU ones alone in a CPU worker."""
    if cpu_only:
        cpus = [p for p in settings.execution_providers if name_of(p) not in GPU_PROVIDERS]
        return cpus or [CPU]
    return list(settings.execution_providers)


@functools.cache
def preload_cuda() -> None:
    """Load the CUDA and cuDNN libraries that pip installed (onnxruntime-gpu[cuda,cudnn]), once per process:
    the dynamic loader does not look in site-packages, and without them the CUDA provider cannot be created."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # noqa: BLE001 - libraries from the system (a CUDA image) still load
            logger.info("onnxruntime.preload_dlls: %s", exc)


# TensorRT's libraries that ONNX Runtime's TensorRT provider links to, in the order they load (the last two
# need the first).
TENSORRT_LIBRARIES = ("libnvinfer.so", "libnvinfer_plugin.so", "libnvonnxparser.so")


@functools.cache
def preload_tensorrt() -> None:
    """Load TensorRT's libraries that pip installed (tensorrt-cu13-libs: the ``tensorrt_libs`` package), once per
    process. ONNX Runtime's TensorRT provider links to them, and the dynamic loader does not look in
    site-packages: without this, the provider cannot be created unless LD_LIBRARY_PATH names that folder. A
    TensorRT the loader finds by itself (a TensorRT base image) needs nothing, and then there is no package."""
    import ctypes  # here, not at the top: a cold start on the CPU never pays for it
    import importlib

    try:
        package = importlib.import_module("tensorrt_libs")
    except ImportError:
        return
    except Exception as exc:  # noqa: BLE001 - its import loads the libraries; what failed shows again below
        logger.warning("tensorrt_libs did not import: %s", exc)
        return
    for folder in getattr(package, "__path__", []):
        for stem in TENSORRT_LIBRARIES:
            for library in sorted(Path(folder).glob(f"{stem}.*")):
                try:
                    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
                except OSError as exc:
                    logger.warning("TensorRT library %s did not load: %s", library, exc)


def ort_providers(settings: ModelSettings, where: str, cpu_only: bool = False) -> tuple[list[OrtProvider], str | None]:
    """ONNX Runtime's provider list (names with their options) for a model, and the fall back's reason when a
    GPU provider is not in this build of ONNX Runtime (a :class:`ModelLoadError` unless ``cpu_fallback``)."""
    wanted = requested(settings, cpu_only)
    names = [name_of(p) for p in wanted]
    if any(n in GPU_PROVIDERS for n in names) and any(n in GPU_PROVIDERS for n in ort.get_available_providers()):
        preload_cuda()
    if TENSORRT in names and TENSORRT in ort.get_available_providers():
        preload_tensorrt()
    unknown = [n for n in names if n not in ort.get_all_providers()]
    if unknown:
        raise ModelLoadError(f"{where}: unknown execution providers {unknown}")
    available = set(ort.get_available_providers())
    missing = [n for n in names if n not in available]
    reason = None
    if missing:
        reason = (
            f"execution providers {missing} are not in this build of onnxruntime (it has {sorted(available)}); "
            "install fnserve[gpu] (onnxruntime-gpu, never beside onnxruntime) on a machine with CUDA"
        )
        if any(n in GPU_PROVIDERS for n in missing) and not settings.cpu_fallback:
            raise ModelLoadError(f"{where}: {reason}, or set cpu_fallback = true to run it on the CPU")
        logger.warning("%s: %s; running on %s", where, reason, [n for n in names if n in available] or [CPU])
    chosen = [ort_provider(p, where) for p in wanted if name_of(p) in available]
    return chosen or [CPU], reason


def check(session: Any, settings: ModelSettings, where: str, fallback: str | None, cpu_only: bool = False) -> Placement:
    """Where ``session`` really runs; a GPU provider asked for and not registered is a :class:`ModelLoadError`
    unless ``cpu_fallback`` (then a warning, and the placement says why)."""
    got = tuple(session.get_providers())
    lost = [n for n in (name_of(p) for p in requested(settings, cpu_only)) if n in GPU_PROVIDERS and n not in got]
    if lost and fallback is None:
        fallback = f"{lost} could not be created (see onnxruntime's 'EP Error' above); the session runs on {list(got)}"
        if not settings.cpu_fallback:
            raise ModelLoadError(f"{where}: execution provider {fallback}; set cpu_fallback = true to allow it")
        logger.warning("%s: %s", where, fallback)
    return Placement(got, device_of(session), fallback)


def cuda_graphs(settings: ModelSettings, placement: Placement) -> bool:
    """Whether this session was created with CUDA graph capture: its CUDA provider asks, and it got that provider
    (a CPU worker of a mixed pool asks for none)."""
    return CUDA in placement.providers and settings.cuda_graphs


def device_of(session: Any) -> str:
    """``cuda:N`` for a session on a GPU provider (N its device id), else ``cpu``."""
    for name in session.get_providers():
        if name in GPU_PROVIDERS:
            return f"cuda:{session.get_provider_options().get(name, {}).get('device_id', 0)}"
    return "cpu"


def ort_provider(provider: Provider, where: str) -> OrtProvider:
    """One provider as ONNX Runtime takes it: its name, with its options where the manifest gave a table (and a
    TensorRT table's cache folder made, or a :class:`ModelLoadError` saying why it cannot be)."""
    if isinstance(provider, CudaProvider):
        options: dict[str, Any] = {
            "device_id": provider.device_id,
            "cudnn_conv_algo_search": provider.cudnn_conv_algo_search,
            # Copies on their own streams, overlapping compute, unless asked to share the compute stream.
            "do_copy_in_default_stream": not provider.copy_streams,
            "arena_extend_strategy": "kSameAsRequested",
        }
        if provider.cuda_graph:
            options["enable_cuda_graph"] = "1"  # the graphs themselves: core.models.shape_sessions.GraphSession
        if provider.memory_limit_mb is not None:
            options["gpu_mem_limit"] = provider.memory_limit_mb * 2**20
        return CUDA, options
    if isinstance(provider, TensorrtProvider):
        options = {
            "device_id": provider.device_id,
            "trt_fp16_enable": provider.fp16,
            "trt_int8_enable": provider.int8,
        }
        if provider.max_workspace_mb is not None:
            options["trt_max_workspace_size"] = provider.max_workspace_mb * 2**20
        if provider.cache_dir is not None:
            # Engines and timings built once, reused by every later start (and every worker).
            writable_cache(Path(provider.cache_dir), where)
            options.update(
                trt_engine_cache_enable=True,
                trt_engine_cache_path=provider.cache_dir,
                trt_timing_cache_enable=True,
                trt_timing_cache_path=provider.cache_dir,
            )
        for key, shapes in (
            ("trt_profile_min_shapes", provider.min_shapes),
            ("trt_profile_opt_shapes", provider.opt_shapes),
            ("trt_profile_max_shapes", provider.max_shapes),
        ):
            if shapes:
                options[key] = ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())
        return TENSORRT, options
    return provider


def writable_cache(folder: Path, where: str) -> None:
    """Make TensorRT's cache folder, or say at start why it cannot be written: TensorRT would otherwise build
    its engines at every start and fail only when it saves them."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"{where}: TensorRT's cache_dir {str(folder)!r} cannot be made: {exc}") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ModelLoadError(f"{where}: TensorRT's cache_dir {str(folder)!r} is not writable by this process")
