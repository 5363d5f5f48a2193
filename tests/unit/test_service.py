from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fnserve.core.errors import FnserveError, InvalidInput, ModelLoadError, ModelNotFound, ModelNotReady
from fnserve.core.execution.service import InferenceService
from tests.helpers import ManifestWriter, model_bytes


@pytest.fixture
def service(write_manifest: ManifestWriter) -> InferenceService:
    return InferenceService.from_manifest(write_manifest({"data": model_bytes(), "max_batch_size": 4}))


def feed(n: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "k": np.arange(n, dtype=np.int64)}


def test_predict_returns_every_output(service: InferenceService) -> None:
    out = service.predict("scale", feed())
    np.testing.assert_array_equal(out["y"], feed()["x"] * 2)
    np.testing.assert_array_equal(out["k1"], [1, 2])


def test_requested_outputs_only_in_the_order_asked(service: InferenceService) -> None:
    out = service.predict("scale", feed(), outputs=["k1"])
    assert list(out) == ["k1"]


def test_unknown_output_is_422(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match=r"model 'scale' has no outputs \['z'\]; it has \['y', 'k1'\]"):
        service.predict("scale", feed(), outputs=["z"])


def test_unknown_model_and_version_are_404(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound):
        service.predict("nope", feed())
    with pytest.raises(ModelNotFound, match="'scale' version 3 is not found"):
        service.predict("scale", feed(), version="3")


def test_missing_and_extra_inputs_are_named(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match=r"takes inputs \['x', 'k'\]: missing inputs \['k'\]$"):
        service.predict("scale", {"x": feed()["x"]})
    with pytest.raises(InvalidInput, match=r"unexpected inputs \['z'\]"):
        service.predict("scale", {**feed(), "z": np.zeros(2)})
    with pytest.raises(InvalidInput, match=r"missing inputs \['k'\]; unexpected inputs \['kk'\]"):
        service.predict("scale", {"x": feed()["x"], "kk": feed()["k"]})


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int8, np.uint8, np.int16])
def test_safe_casts_and_float_narrowing_are_accepted(service: InferenceService, dtype: type) -> None:
    inputs = feed()
    inputs["x"] = inputs["x"].astype(dtype)
    np.testing.assert_array_equal(service.predict("scale", inputs)["y"], feed()["x"] * 2)


def test_python_lists_are_accepted(service: InferenceService) -> None:
    out = service.predict("scale", {"x": [[1.0, 2.0, 3.0]], "k": [5]})
    np.testing.assert_array_equal(out["k1"], [6])


def test_float_narrowing_refuses_values_past_the_narrower_range(service: InferenceService) -> None:
    inputs = feed()
    inputs["x"] = inputs["x"].astype(np.float64)
    inputs["x"][1, 2] = 1e308  # an FP32 infinity, had it been cast
    with pytest.raises(InvalidInput, match="input 'x' of model 'scale': values out of range for FP32"):
        service.predict("scale", inputs)
    inputs["x"][1, 2] = np.inf  # an infinity sent as one stays one
    assert np.isinf(service.predict("scale", inputs)["y"][1, 2])


def test_runtime_errors_are_the_inputs_when_a_kernel_refuses_it_and_the_servers_otherwise() -> None:
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    from fnserve.core.errors import InferenceError
    from fnserve.core.execution.servable import runtime_error

    gather = (
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Gather node. "
        "Name:'/emb/Gather' Status Message: indices element out of data bounds, idx=40000 must be within [-30522,30521]"
    )
    error = runtime_error("m", InvalidArgument(gather))
    assert isinstance(error, InvalidInput)
    assert error.message == (
        "model 'm' cannot run this input: Gather node '/emb/Gather': "
        "indices element out of data bounds, idx=40000 must be within [-30522,30521]"
    )
    add = (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Add node. Name:'/emb/Add_1' "
        "Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/math/element_wise_ops.h:583 void "
        "onnxruntime::BroadcastIterator::Append(ptrdiff_t, ptrdiff_t) axis == 1 || axis == largest was false. "
        "Attempting to broadcast an axis by a dimension other than 1. 512 by 600"
    )
    error = runtime_error("m", Fail(add))
    assert isinstance(error, InvalidInput)
    assert error.message.endswith(
        "Add node '/emb/Add_1': Attempting to broadcast an axis by a dimension other than 1. 512 by 600"
    )
    for machine in (
        Fail(
            "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MatMul node. Name:'mm' "
            "Status Message: CUDA error cudaErrorMemoryAllocation:out of memory"
        ),
        RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer"),
        ValueError("something else entirely"),
    ):
        error = runtime_error("m", machine)
        assert isinstance(error, InferenceError) and error.status_code == 500
        assert error.message == "inference failed in model 'm'"  # the server's detail stays in its log


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("k", np.float32), ("k", np.uint64), ("x", np.int64), ("x", np.complex64), ("k", np.str_)],
)
def test_unsafe_casts_are_refused(service: InferenceService, name: str, dtype: type) -> None:
    inputs = feed()
    inputs[name] = inputs[name].astype(dtype)
    with pytest.raises(InvalidInput, match=f"input '{name}' of model 'scale' must be .* cannot be cast to it safely"):
        service.predict("scale", inputs)


def test_wrong_rank_is_refused(service: InferenceService) -> None:
    with pytest.raises(
        InvalidInput,
        match=r"input 'x' of model 'scale' must have rank 2 \(shape \[-1, 3\]\), got shape \[6\]",
    ):
        service.predict("scale", {"x": np.zeros(6, np.float32), "k": np.zeros(2, np.int64)})


def test_wrong_fixed_dimension_is_refused(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match=r"must have 3 at axis 1 \(shape \[-1, 3\]\), got shape \[2, 4\]"):
        service.predict("scale", {"x": np.zeros((2, 4), np.float32), "k": np.zeros(2, np.int64)})


def test_empty_batch_is_refused(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match="input 'x' of model 'scale' is an empty batch"):
        service.predict("scale", feed(0))


def test_inputs_disagreeing_on_batch_size_are_refused(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match="disagree on the batch size: 'k' has 3, another input has 2"):
        service.predict("scale", {"x": feed(2)["x"], "k": feed(3)["k"]})


def test_batches_over_max_batch_size_are_chunked_transparently(service: InferenceService) -> None:
    out = service.predict("scale", feed(11))
    np.testing.assert_array_equal(out["y"], feed(11)["x"] * 2)
    np.testing.assert_array_equal(out["k1"], np.arange(11) + 1)


def test_every_validation_error_is_a_422(service: InferenceService) -> None:
    assert InvalidInput.status_code == 422
    assert ModelNotReady.status_code == 503
    assert issubclass(ModelLoadError, ModelNotReady)


def test_metadata_comes_from_the_graph(service: InferenceService) -> None:
    meta = service.model_metadata("scale")
    assert meta == {
        "name": "scale",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "k", "datatype": "INT64", "shape": [-1, 1]},  # one value a row, as Triton describes it
        ],
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "k1", "datatype": "INT64", "shape": [-1]},
        ],
        "parameters": {"providers": ["CPUExecutionProvider"], "device": "cpu"},
    }


def test_readiness_reports_broken_models_without_raising(write_manifest: ManifestWriter) -> None:
    service = InferenceService.from_manifest(
        write_manifest({"data": model_bytes()}, {"data": model_bytes(), "name": "broken", "sha256": "e" * 64})
    )
    assert service.model_ready("scale") is True
    assert service.model_ready("broken") is False
    assert service.ready() is False
    with pytest.raises(ModelNotFound):
        service.model_ready("nope")
    with pytest.raises(ModelLoadError) as info:
        service.predict("broken", feed())
    assert info.value.status_code == 503


def test_eager_loading_fails_at_start(write_manifest: ManifestWriter) -> None:
    manifest = write_manifest({"data": model_bytes(), "sha256": "e" * 64})
    with pytest.raises(ModelLoadError):
        InferenceService.from_manifest(manifest, eager=True)


def test_errors_cross_process_boundaries_as_plain_data() -> None:
    data = InvalidInput("bad tensor").to_dict()
    assert data == {"type": "InvalidInput", "message": "bad tensor", "status_code": 422}
    rebuilt = FnserveError.from_dict(data)
    assert type(rebuilt) is InvalidInput and rebuilt.message == "bad tensor" and rebuilt.status_code == 422
    assert type(FnserveError.from_dict({"type": "os.system", "message": "x"})) is FnserveError


def test_service_is_importable_without_web_or_aws_libraries(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, fnserve, fnserve.core.execution.service\n"
        "bad = [m for m in ('boto3', 'botocore', 'fastapi', 'mangum', 'starlette') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bytes_inputs_reach_the_runtime_as_text_and_must_be_utf8(write_manifest: ManifestWriter) -> None:
    from tests.helpers import identity_model, sample_arrays

    service = InferenceService.from_manifest(
        write_manifest({"name": "identity", "data": model_bytes(identity_model())})
    )
    inputs = {f"in_{k}": v for k, v in sample_arrays().items()}
    out = service.predict("identity", inputs, outputs=["out_BYTES"])["out_BYTES"]
    assert out.tolist() == [[v.decode() for v in row] for row in inputs["in_BYTES"]]
    inputs["in_BYTES"] = np.array([[b"\xff", b"ok"]] * 3, dtype=object)
    with pytest.raises(InvalidInput, match="input 'in_BYTES' of model 'identity': BYTES elements must be UTF-8"):
        service.predict("identity", inputs)


def test_infer_many_runs_valid_jobs_together_and_isolates_bad_ones(service: InferenceService) -> None:
    jobs = [feed(1), {"x": np.zeros((1, 4), np.float32), "k": np.zeros(1, np.int64)}, feed(3), {"x": feed(1)["x"]}]
    results = service.infer_many("scale", jobs)
    assert [type(r).__name__ for r in results] == ["Prediction", "InvalidInput", "Prediction", "InvalidInput"]
    np.testing.assert_array_equal(results[2].outputs["y"], feed(3)["x"] * 2)  # type: ignore[union-attr]
    assert results[0].outputs["y"].shape == (1, 3)  # type: ignore[union-attr]


def test_infer_many_chunks_large_stacks_by_max_batch_size(service: InferenceService) -> None:
    results = service.infer_many("scale", [feed(3) for _ in range(5)])  # 15 rows, max_batch_size 4
    for r in results:
        np.testing.assert_array_equal(r.outputs["k1"], [1, 2, 3])  # type: ignore[union-attr]


def test_infer_many_uses_the_cache_for_repeated_inputs(write_manifest: ManifestWriter) -> None:
    from fnserve.core.execution.cache import ResultCache

    manifest = write_manifest({"data": model_bytes(), "cache_ttl_seconds": 60})
    service = InferenceService.from_manifest(manifest, cache=ResultCache())
    first = service.infer_many("scale", [feed(2), feed(1)])
    second = service.infer_many("scale", [feed(1), feed(2), feed(3)])
    assert [r.cache for r in first] == ["miss", "miss"]  # type: ignore[union-attr]
    assert [r.cache for r in second] == ["hit", "hit", "miss"]  # type: ignore[union-attr]
    assert service.infer("scale", feed(3)).cache == "hit"


def test_infer_many_never_stacks_a_model_that_reduces_over_the_batch(write_manifest: ManifestWriter) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0)],
        "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [3])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    service = InferenceService.from_manifest(write_manifest({"name": "sum", "data": model_bytes(model)}))
    jobs = [{"x": np.ones((1, 3), np.float32)}, {"x": np.full((2, 3), 2, np.float32)}]  # 3 rows, output length 3
    results = service.infer_many("sum", jobs)
    np.testing.assert_array_equal(results[0].outputs["total"], [1, 1, 1])  # type: ignore[union-attr]
    np.testing.assert_array_equal(results[1].outputs["total"], [4, 4, 4])  # type: ignore[union-attr]


def test_packed_predictions_are_the_stacked_ones_by_column(write_manifest: ManifestWriter) -> None:
    """What a batch stores (``pack``) holds every job's outputs, hits and misses alike, as the unpacked answer."""
    from fnserve.core.codec.tensors import unpack_arrays
    from fnserve.core.execution.cache import ResultCache
    from fnserve.core.execution.service import Packed

    manifest = write_manifest({"data": model_bytes(), "cache_ttl_seconds": 60, "max_batch_size": 4})
    cached = InferenceService.from_manifest(manifest, cache=ResultCache())
    cached.infer("scale", feed(1))  # the second job is a hit
    jobs = [feed(2), feed(1), feed(3)]
    stacked = {name: np.concatenate([job[name] for job in jobs]) for name in jobs[0]}
    packed = cached.infer_columns("scale", stacked, [2, 1, 3], outputs=["y", "k1"])
    plain = InferenceService.from_manifest(manifest).infer_columns(
        "scale", stacked, [2, 1, 3], outputs=["y", "k1"], pack=False
    )
    assert isinstance(packed, Packed) and len(packed) == 3 and packed.hits == 1
    assert [p.cache for p in packed] == ["miss", "hit", "miss"] and [p.cache for p in plain] == ["off"] * 3
    for want, got, blob in zip(plain, packed, packed.packed, strict=True):
        assert list(got.outputs) == ["y", "k1"] and got.packed == blob
        for name in ("y", "k1"):
            np.testing.assert_array_equal(got.outputs[name], want.outputs[name])
            np.testing.assert_array_equal(unpack_arrays(blob)[name], want.outputs[name])
    assert [p.outputs["y"].shape for p in packed[1:]] == [(1, 3), (3, 3)]


def test_packed_predictions_without_a_cache_are_split_by_each_jobs_rows(write_manifest: ManifestWriter) -> None:
    service = InferenceService.from_manifest(write_manifest({"data": model_bytes()}))
    stacked = {name: np.concatenate([a, a]) for name, a in feed(2).items()}
    packed = service.infer_columns("scale", stacked, [1, 3])
    assert [p.outputs["y"].shape[0] for p in packed] == [1, 3] and [p.cache for p in packed] == ["off", "off"]
    np.testing.assert_array_equal(packed[1].outputs["y"], stacked["x"][1:] * 2)
    with pytest.raises(InvalidInput, match="stacked inputs have 4 rows, the jobs claim 3"):
        service.infer_columns("scale", stacked, [1, 2])
