"""Engine layer: read a GGUF's tensor table and planner metadata through ggml's gguf C API (milliseconds).

A table read is kept in memory for the file it came from (same path, inode, size and modification time): planning
one budget reads it for every placement it sizes (28 times for the default model, 8-11 ms each on the 2-core
VM), and a daemon plans again whenever the game's budget changes. A changed file is read afresh.

This is also the gate every model file passes *before* llama.cpp sees it: missing file, wrong magic,
unparsable header, tensor data outside the file (truncated download) or an architecture the engine does not
run each raise a typed ``ModelError`` here instead of crashing or confusing llama.cpp later.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path

from igi_sdk.engine import _ggml
from igi_sdk.errors import ModelCorruptError, ModelNotFoundError, ModelUnsupportedError
from igi_sdk.files import FileIdentity, file_identity
from igi_sdk.planner.tensors import ModelTable, TensorInfo, classify
from igi_sdk.planner.vision import VisionShape

GGUF_MAGIC = b"GGUF"

# llama.cpp architectures this engine does not run: encoders/embedders, recurrent state, diffusion, audio,
# vision towers and draft heads (sequence-state save/restore and the planner assume a KV-cache decoder).
UNSUPPORTED_ARCHITECTURES = frozenset(
    {
        "clip",
        "bert",
        "modern-bert",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "eurobert",
        "t5",
        "t5encoder",
        "wavtokenizer-dec",
        "gemma-embedding",
        "llama-embed",
        "qwen3tts",
        "pockettts",
        "mamba",
        "mamba2",
        "rwkv6",
        "rwkv6qwen2",
        "rwkv7",
        "arwkv7",
        "dream",
        "llada",
        "llada-moe",
        "eagle3",
        "dflash",
        "gemma4-assistant",
    }
)

# Decoder architectures of llama.cpp (vendored in llama-cpp-python 0.3.36) that the engine accepts.
SUPPORTED_ARCHITECTURES = frozenset(
    {
        "llama",
        "llama4",
        "deci",
        "falcon",
        "grok",
        "gpt2",
        "gptj",
        "gptneox",
        "mpt",
        "baichuan",
        "starcoder",
        "refact",
        "bloom",
        "stablelm",
        "qwen",
        "qwen2",
        "qwen2moe",
        "qwen2vl",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "qwen3vl",
        "qwen3vlmoe",
        "qwen35",
        "qwen35moe",
        "phi2",
        "phi3",
        "phimoe",
        "plamo",
        "plamo2",
        "plamo3",
        "codeshell",
        "orion",
        "internlm2",
        "minicpm",
        "minicpm3",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4",
        "starcoder2",
        "jamba",
        "falcon-h1",
        "xverse",
        "command-r",
        "cohere2",
        "cohere2moe",
        "dbrx",
        "olmo",
        "olmo2",
        "olmoe",
        "openelm",
        "arctic",
        "deepseek",
        "deepseek2",
        "chatglm",
        "glm4",
        "glm4moe",
        "bitnet",
        "jais",
        "jais2",
        "nemotron",
        "nemotron_h",
        "nemotron_h_moe",
        "exaone",
        "exaone4",
        "exaone-moe",
        "granite",
        "granitemoe",
        "granitehybrid",
        "granite_swa",
        "chameleon",
        "plm",
        "bailingmoe",
        "bailingmoe2",
        "dots1",
        "arcee",
        "afmoe",
        "ernie4_5",
        "ernie4_5-moe",
        "hunyuan-moe",
        "hunyuan-dense",
        "smollm3",
        "gpt-oss",
        "lfm2",
        "lfm2moe",
        "smallthinker",
        "seed_oss",
        "grovemoe",
        "apertus",
        "minimax-m2",
        "mistral3",
        "mistral4",
        "mimo2",
        "step35",
        "maincoder",
        "nanbeige",
        "mellum",
    }
)


_TABLE_CACHE_MAX = 8
"""Tables kept in memory (least recently used dropped first): a daemon serves one model, a benchmark a few."""
_table_cache: OrderedDict[tuple[str, FileIdentity], ModelTable] = OrderedDict()
_table_lock = threading.Lock()  # the planner sizes placements from a thread pool


class _Gguf:
    """An open gguf context (no tensor data loaded) with typed metadata getters."""

    def __init__(self, path: Path) -> None:
        params = _ggml.gguf_init_params(no_alloc=True, ctx=None)
        self.ctx = _ggml.gguf_init_from_file(os.fsencode(path), params)
        if not self.ctx:
            raise ModelCorruptError(f"{path}: GGUF header does not parse (corrupt or truncated metadata)")

    def close(self) -> None:
        if self.ctx:
            _ggml.gguf_free(self.ctx)
            self.ctx = None

    def key(self, key: str) -> int:
        return int(_ggml.gguf_find_key(self.ctx, key.encode()))

    def get_str(self, key: str) -> str | None:
        kid = self.key(key)
        if kid < 0 or _ggml.gguf_get_kv_type(self.ctx, kid) != _ggml.GGUF_TYPE_STRING:
            return None
        return (_ggml.gguf_get_val_str(self.ctx, kid) or b"").decode("utf-8", "replace")

    def get_int(self, key: str) -> int | None:
        """An integer value; for a per-layer array of integers, its maximum."""
        kid = self.key(key)
        if kid < 0:
            return None
        kv_type = _ggml.gguf_get_kv_type(self.ctx, kid)
        scalar = {
            _ggml.GGUF_TYPE_UINT32: _ggml.gguf_get_val_u32,
            _ggml.GGUF_TYPE_INT32: _ggml.gguf_get_val_i32,
            _ggml.GGUF_TYPE_UINT64: _ggml.gguf_get_val_u64,
            _ggml.GGUF_TYPE_INT64: _ggml.gguf_get_val_i64,
            _ggml.GGUF_TYPE_UINT16: _ggml.gguf_get_val_u16,
        }
        if kv_type in scalar:
            return int(scalar[kv_type](self.ctx, kid))
        if kv_type == _ggml.GGUF_TYPE_ARRAY:
            arr_type, n = _ggml.gguf_get_arr_type(self.ctx, kid), _ggml.gguf_get_arr_n(self.ctx, kid)
            ctype = {_ggml.GGUF_TYPE_UINT32: ctypes.c_uint32, _ggml.GGUF_TYPE_INT32: ctypes.c_int32}.get(arr_type)
            if ctype is None or n == 0:
                return None
            data = ctypes.cast(_ggml.gguf_get_arr_data(self.ctx, kid), ctypes.POINTER(ctype))
            return max(int(data[i]) for i in range(n))
        return None

    def arr_n(self, key: str) -> int | None:
        kid = self.key(key)
        if kid < 0 or _ggml.gguf_get_kv_type(self.ctx, kid) != _ggml.GGUF_TYPE_ARRAY:
            return None
        return int(_ggml.gguf_get_arr_n(self.ctx, kid))


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Existence and magic check, cheap enough for every load.

    Raises:
        ModelNotFoundError: the path does not exist or cannot be read (a symlink loop, a name too long).
        ModelCorruptError: not a regular file, or it does not start with the GGUF magic.
    """
    if os.fspath(path).strip() == "":  # Path("") is ".", the current directory: name the real mistake
        raise ModelNotFoundError("model path is empty")
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        raise ModelNotFoundError(f"model file not found: {p}") from None
    except OSError as exc:  # a symlink loop, a name too long, a permission: the OS's reason, typed
        raise ModelNotFoundError(f"model file not readable: {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):  # a directory, FIFO or device: there, but no GGUF
        raise ModelCorruptError(f"model path is not a regular file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelNotFoundError(f"model file not readable: {p}: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelCorruptError(f"{p} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    return p


def _tensors(g: _Gguf, path: Path, file_bytes: int) -> tuple[TensorInfo, ...]:
    data_offset = int(_ggml.gguf_get_data_offset(g.ctx))
    tensors = []
    for tid in range(int(_ggml.gguf_get_n_tensors(g.ctx))):
        name = (_ggml.gguf_get_tensor_name(g.ctx, tid) or b"").decode("utf-8", "replace")
        offset = data_offset + int(_ggml.gguf_get_tensor_offset(g.ctx, tid))
        n_bytes = int(_ggml.gguf_get_tensor_size(g.ctx, tid))
        if offset + n_bytes > file_bytes:
            raise ModelCorruptError(
                f"{path}: tensor {name!r} data [{offset}, {offset + n_bytes}) lies beyond the end of the file "
                f"({file_bytes} bytes): the file is truncated"
            )
        ne = _ggml.gguf_get_tensor_ne(g.ctx, tid)
        dims = [int(ne[i]) for i in range(4)]
        while len(dims) > 1 and dims[-1] == 1:
            dims.pop()
        type_id = _ggml.gguf_get_tensor_type(g.ctx, tid)
        layer, group = classify(name)
        tensors.append(
            TensorInfo(
                name=name,
                layer=layer,
                group=group,
                ggml_type=(_ggml.ggml_type_name(type_id) or b"?").decode(),
                shape=tuple(dims),
                n_bytes=n_bytes,
                file_offset=offset,
            )
        )
    return tuple(tensors)


#: llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS: beyond these it aborts the process (GGML_ASSERT) at load
MAX_LAYERS = 512
MAX_EXPERTS = 512


def _check_shape(
    path: Path,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_expert: int,
    n_expert_used: int,
    tensors: tuple[TensorInfo, ...],
) -> None:
    """Metadata llama.cpp would abort on (an assert kills the process, no Python error), or that would make the
    planner loop for ever (a block count of 10^5): refused here as a corrupt model, before anything loads it."""
    if not 1 <= n_layer <= MAX_LAYERS:
        raise ModelCorruptError(f"{path}: block_count {n_layer} is outside 1..{MAX_LAYERS}")
    if n_embd < 1 or n_head < 1:
        raise ModelCorruptError(f"{path}: embedding_length {n_embd} and attention.head_count {n_head} must be >= 1")
    if n_expert and not 1 <= n_expert_used <= n_expert <= MAX_EXPERTS:
        raise ModelCorruptError(
            f"{path}: expert_used_count {n_expert_used} and expert_count {n_expert} must satisfy "
            f"1 <= used <= count <= {MAX_EXPERTS}"
        )
    beyond = next((t for t in tensors if t.layer is not None and t.layer >= n_layer), None)
    if beyond is not None:
        raise ModelCorruptError(
            f"{path}: tensor {beyond.name!r} names layer {beyond.layer}, but block_count is {n_layer}"
        )


def read_tensor_table(path: str | os.PathLike[str]) -> ModelTable:
    """Tensor table and planner metadata of a GGUF file, validated.

    Raises:
        ModelNotFoundError: no such file.
        ModelCorruptError: not a GGUF, unparsable, truncated, or missing required metadata.
        ModelUnsupportedError: an architecture this engine does not run.
    """
    p = check_gguf_file(path)
    st = p.stat()
    key = (str(p), file_identity(st))
    with _table_lock:
        table = _table_cache.get(key)
        if table is not None:
            _table_cache.move_to_end(key)
            return table
    table = _read_table(p, st.st_size)
    with _table_lock:
        _table_cache[key] = table
        while len(_table_cache) > _TABLE_CACHE_MAX:
            _table_cache.popitem(last=False)
    return table


def _read_table(p: Path, file_bytes: int) -> ModelTable:
    g = _Gguf(p)
    try:
        arch = g.get_str("general.architecture")
        if not arch:
            raise ModelCorruptError(f"{p}: no general.architecture key")
        if arch not in SUPPORTED_ARCHITECTURES:
            why = "not a KV-cache text decoder" if arch in UNSUPPORTED_ARCHITECTURES else "unknown to llama.cpp"
            raise ModelUnsupportedError(f"{p}: architecture {arch!r} is not supported ({why})")
        tensors = _tensors(g, p, file_bytes)

        def need(key: str) -> int:
            value = g.get_int(f"{arch}.{key}")
            if value is None:
                raise ModelCorruptError(f"{p}: required metadata {arch}.{key} missing")
            return value

        n_layer, n_embd, n_head = need("block_count"), need("embedding_length"), need("attention.head_count")
        n_head_kv = g.get_int(f"{arch}.attention.head_count_kv") or n_head
        head_dim = n_embd // n_head if n_head else 0
        n_expert = g.get_int(f"{arch}.expert_count") or 0
        n_ff = (
            (g.get_int(f"{arch}.expert_feed_forward_length") if n_expert else None)
            or g.get_int(f"{arch}.feed_forward_length")
            or 0
        )
        n_expert_used = g.get_int(f"{arch}.expert_used_count") or 0
        _check_shape(p, n_layer, n_embd, n_head, n_expert, n_expert_used, tensors)
        by_name = {t.name: t for t in tensors}
        embd = by_name.get("token_embd.weight") or by_name.get("output.weight")
        n_vocab = (
            g.arr_n("tokenizer.ggml.tokens")
            or g.get_int(f"{arch}.vocab_size")
            or (embd.shape[1] if embd is not None and len(embd.shape) > 1 else 0)
        )
        return ModelTable(
            path=str(p),
            architecture=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=g.get_int(f"{arch}.attention.key_length") or head_dim,
            n_embd_head_v=g.get_int(f"{arch}.attention.value_length") or head_dim,
            n_ff=n_ff,
            n_vocab=n_vocab,
            n_ctx_train=g.get_int(f"{arch}.context_length") or 0,
            n_expert=n_expert,
            n_expert_used=n_expert_used,
            file_bytes=file_bytes,
            tensors=tensors,
        )
    finally:
        g.close()


def chat_template_of(path: str | os.PathLike[str]) -> str | None:
    """The GGUF's ``tokenizer.chat_template`` (None if it has none)."""
    g = _Gguf(check_gguf_file(path))
    try:
        return g.get_str("tokenizer.chat_template")
    finally:
        g.close()


PROJECTOR_TYPES = ("idefics3", "qwen2.5vl_merger")
"""Vision projectors (mmproj) the engine runs: their image embeddings take consecutive LLM positions."""


def read_projector_shape(path: str | os.PathLike[str]) -> VisionShape:
    """The shape of a vision projector (mmproj GGUF), validated before mtmd sees the file.

    Raises:
        ModelNotFoundError: no such file.
        ModelCorruptError: not a GGUF, truncated, or required ``clip.vision.*`` metadata missing or absurd.
        ModelUnsupportedError: not a vision projector, or a projector type the engine does not run.
    """
    p = check_gguf_file(path)
    g = _Gguf(p)
    try:
        arch = g.get_str("general.architecture")
        if arch != "clip":
            raise ModelUnsupportedError(f"{p}: architecture {arch!r} is not a vision projector (expected 'clip')")
        kind = g.get_str("clip.projector_type") or g.get_str("clip.vision.projector_type")
        if kind not in PROJECTOR_TYPES:
            raise ModelUnsupportedError(
                f"{p}: projector type {kind!r} is not supported (supported: {', '.join(PROJECTOR_TYPES)})"
            )
        tensors = _tensors(g, p, p.stat().st_size)

        def need(key: str) -> int:
            value = g.get_int(f"clip.vision.{key}")
            if value is None or not 1 <= value <= 1 << 20:
                raise ModelCorruptError(f"{p}: clip.vision.{key} is missing or outside 1..{1 << 20}")
            return value

        n_layer = need("block_count")
        if n_layer > MAX_LAYERS:
            raise ModelCorruptError(f"{p}: clip.vision.block_count {n_layer} is outside 1..{MAX_LAYERS}")
        qwen = kind == "qwen2.5vl_merger"
        merge = g.get_int("clip.vision.spatial_merge_size" if qwen else "clip.vision.projector.scale_factor")
        weight = next((t for t in tensors if t.name == "v.blk.0.attn_q.weight"), None)
        try:
            return VisionShape(
                projector_type=kind,
                n_layer=n_layer,
                n_embd=need("embedding_length"),
                n_ff=need("feed_forward_length"),
                n_head=need("attention.head_count"),
                patch_size=need("patch_size"),
                image_size=need("image_size"),
                n_merge=merge or 2,
                projection_dim=need("projection_dim"),
                longest_edge=g.get_int("clip.vision.preproc_image_size") or 0,
                n_wa_pattern=g.get_int("clip.vision.n_wa_pattern") or 0,
                weight_type="f32" if weight is not None and weight.ggml_type == "f32" else "f16",
                file_weight_bytes=sum(t.n_bytes for t in tensors),
            )
        except ValueError as exc:
            raise ModelCorruptError(f"{p}: projector metadata rejected: {exc}") from exc
    finally:
        g.close()
