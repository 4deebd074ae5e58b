"""Engine layer: ctypes bindings of ggml's device / buffer-type API and of the gguf C API.

The ggml libraries are opened by SONAME with ``RTLD_NOLOAD`` *after* importing llama_cpp, so the handles
point at the very copies llama.cpp uses. Opening ``lib/libggml-base.so`` by path would map a second copy
whose buffer-type pointers never match llama.cpp's (and nothing would report it). Stock
``llama_cpp._ggml`` makes that mistake, so it is not used.

Every binding carries its C prototype as a comment. ``check_bindings()`` runs at import and raises
``EngineError`` naming any symbol that does not resolve.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

import llama_cpp  # noqa: F401  (must be loaded first: it maps the ggml libraries we attach to)

from igi_sdk.errors import EngineError

if sys.platform == "darwin":
    _BASE_NAMES, _GGML_NAMES = ("libggml-base.dylib", "libggml-base.0.dylib"), ("libggml.dylib", "libggml.0.dylib")
else:
    _BASE_NAMES, _GGML_NAMES = ("libggml-base.so.0", "libggml-base.so"), ("libggml.so.0", "libggml.so")

_NOLOAD = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)


def _attach(names: tuple[str, ...]) -> ctypes.CDLL:
    """Attach to an already-loaded library by SONAME; never map a second copy."""
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name, mode=_NOLOAD)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise EngineError(
        "ggml library is not loaded by llama_cpp under any expected SONAME "
        f"({'; '.join(errors)}); the llama-cpp-python build is not the expected one"
    )


_base = _attach(_BASE_NAMES)
_ggml = _attach(_GGML_NAMES)

ggml_backend_dev_t = ctypes.c_void_p
ggml_backend_buffer_type_t = ctypes.c_void_p
gguf_context_p = ctypes.c_void_p

_BOUND: list[str] = []


def bind_optional(name: str, restype: Any, argtypes: list[Any]) -> Callable[..., Any] | None:
    """The symbol from the libraries llama_cpp loaded (ggml's, then llama's own), or None where this build lacks it
    (e.g. the project's llama.cpp patches on a stock build)."""
    for lib in (_ggml, _base, llama_cpp.llama_cpp._lib):
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        fn.restype, fn.argtypes = restype, argtypes
        return fn  # type: ignore[no-any-return]
    return None


# ggml_backend_reg_t ggml_backend_reg_by_name(const char * name);  (NULL where no such backend is registered)
_reg_by_name = bind_optional("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p])
# void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);  (NULL: unknown name)
_get_proc_address = bind_optional(
    "ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
)


def cuda_proc(name: str, restype: Any) -> Callable[[], Any] | None:
    """The CUDA registry's function ``name`` of no arguments (the project's patches add some), or None (no CUDA
    backend, or a build without the patch that adds it)."""
    if _reg_by_name is None or _get_proc_address is None:
        return None
    reg = _reg_by_name(b"CUDA")
    if not reg:
        return None
    address = _get_proc_address(reg, name.encode())
    return ctypes.CFUNCTYPE(restype)(address) if address else None


def _bind(name: str, restype: Any, argtypes: list[Any]) -> Callable[..., Any]:
    fn = bind_optional(name, restype, argtypes)
    if fn is None:
        raise EngineError(f"ggml symbol {name!r} not found in the libraries llama_cpp loaded")
    _BOUND.append(name)
    return fn


# enum ggml_backend_dev_type { CPU, GPU, IGPU, ACCEL, META };
DEV_TYPE_NAMES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}

# size_t ggml_backend_dev_count(void);
ggml_backend_dev_count = _bind("ggml_backend_dev_count", ctypes.c_size_t, [])
# ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_get = _bind("ggml_backend_dev_get", ggml_backend_dev_t, [ctypes.c_size_t])
# const char * ggml_backend_dev_name(ggml_backend_dev_t device);
ggml_backend_dev_name = _bind("ggml_backend_dev_name", ctypes.c_char_p, [ggml_backend_dev_t])
# const char * ggml_backend_dev_description(ggml_backend_dev_t device);
ggml_backend_dev_description = _bind("ggml_backend_dev_description", ctypes.c_char_p, [ggml_backend_dev_t])
# enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_dev_type = _bind("ggml_backend_dev_type", ctypes.c_int, [ggml_backend_dev_t])
# void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
ggml_backend_dev_memory = _bind(
    "ggml_backend_dev_memory",
    None,
    [ggml_backend_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
)
# ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
ggml_backend_dev_buffer_type = _bind("ggml_backend_dev_buffer_type", ggml_backend_buffer_type_t, [ggml_backend_dev_t])
# ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);  (NULL if none)
ggml_backend_dev_host_buffer_type = _bind(
    "ggml_backend_dev_host_buffer_type", ggml_backend_buffer_type_t, [ggml_backend_dev_t]
)
# ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
ggml_backend_cpu_buffer_type = _bind("ggml_backend_cpu_buffer_type", ggml_backend_buffer_type_t, [])
# const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buft_name = _bind("ggml_backend_buft_name", ctypes.c_char_p, [ggml_backend_buffer_type_t])
# const char * ggml_type_name(enum ggml_type type);
ggml_type_name = _bind("ggml_type_name", ctypes.c_char_p, [ctypes.c_int])
# ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size);  (NULL on failure)
ggml_backend_buft_alloc_buffer = _bind(
    "ggml_backend_buft_alloc_buffer", ctypes.c_void_p, [ggml_backend_buffer_type_t, ctypes.c_size_t]
)
# void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
ggml_backend_buffer_free = _bind("ggml_backend_buffer_free", None, [ctypes.c_void_p])


# struct gguf_init_params { bool no_alloc; struct ggml_context ** ctx; };
class gguf_init_params(ctypes.Structure):  # noqa: N801  (C name)
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


# enum gguf_type
GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16 = 0, 1, 2, 3
GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL = 4, 5, 6, 7
GGUF_TYPE_STRING, GGUF_TYPE_ARRAY, GGUF_TYPE_UINT64, GGUF_TYPE_INT64, GGUF_TYPE_FLOAT64 = 8, 9, 10, 11, 12

# struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);  (NULL on error)
gguf_init_from_file = _bind("gguf_init_from_file", gguf_context_p, [ctypes.c_char_p, gguf_init_params])
# void gguf_free(struct gguf_context * ctx);
gguf_free = _bind("gguf_free", None, [gguf_context_p])
# size_t gguf_get_data_offset(const struct gguf_context * ctx);
gguf_get_data_offset = _bind("gguf_get_data_offset", ctypes.c_size_t, [gguf_context_p])
# int64_t gguf_get_n_tensors(const struct gguf_context * ctx);
gguf_get_n_tensors = _bind("gguf_get_n_tensors", ctypes.c_int64, [gguf_context_p])
# const char * gguf_get_tensor_name(const struct gguf_context * ctx, int64_t tensor_id);
gguf_get_tensor_name = _bind("gguf_get_tensor_name", ctypes.c_char_p, [gguf_context_p, ctypes.c_int64])
# enum ggml_type gguf_get_tensor_type(const struct gguf_context * ctx, int64_t tensor_id);
gguf_get_tensor_type = _bind("gguf_get_tensor_type", ctypes.c_int, [gguf_context_p, ctypes.c_int64])
# size_t gguf_get_tensor_offset(const struct gguf_context * ctx, int64_t tensor_id);  (relative to data offset)
gguf_get_tensor_offset = _bind("gguf_get_tensor_offset", ctypes.c_size_t, [gguf_context_p, ctypes.c_int64])
# size_t gguf_get_tensor_size(const struct gguf_context * ctx, int64_t tensor_id);
gguf_get_tensor_size = _bind("gguf_get_tensor_size", ctypes.c_size_t, [gguf_context_p, ctypes.c_int64])
# const int64_t * gguf_get_tensor_ne(const struct gguf_context * ctx, int64_t tensor_id);  (GGML_MAX_DIMS = 4)
gguf_get_tensor_ne = _bind("gguf_get_tensor_ne", ctypes.POINTER(ctypes.c_int64), [gguf_context_p, ctypes.c_int64])
# int64_t gguf_find_key(const struct gguf_context * ctx, const char * key);  (-1 if absent)
gguf_find_key = _bind("gguf_find_key", ctypes.c_int64, [gguf_context_p, ctypes.c_char_p])
# enum gguf_type gguf_get_kv_type(const struct gguf_context * ctx, int64_t key_id);
gguf_get_kv_type = _bind("gguf_get_kv_type", ctypes.c_int, [gguf_context_p, ctypes.c_int64])
# enum gguf_type gguf_get_arr_type(const struct gguf_context * ctx, int64_t key_id);
gguf_get_arr_type = _bind("gguf_get_arr_type", ctypes.c_int, [gguf_context_p, ctypes.c_int64])
# The getters below abort the process on a type mismatch: always check gguf_get_kv_type first.
# uint32_t gguf_get_val_u32(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_u32 = _bind("gguf_get_val_u32", ctypes.c_uint32, [gguf_context_p, ctypes.c_int64])
# int32_t gguf_get_val_i32(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_i32 = _bind("gguf_get_val_i32", ctypes.c_int32, [gguf_context_p, ctypes.c_int64])
# uint64_t gguf_get_val_u64(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_u64 = _bind("gguf_get_val_u64", ctypes.c_uint64, [gguf_context_p, ctypes.c_int64])
# int64_t gguf_get_val_i64(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_i64 = _bind("gguf_get_val_i64", ctypes.c_int64, [gguf_context_p, ctypes.c_int64])
# uint16_t gguf_get_val_u16(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_u16 = _bind("gguf_get_val_u16", ctypes.c_uint16, [gguf_context_p, ctypes.c_int64])
# float gguf_get_val_f32(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_f32 = _bind("gguf_get_val_f32", ctypes.c_float, [gguf_context_p, ctypes.c_int64])
# const char * gguf_get_val_str(const struct gguf_context * ctx, int64_t key_id);
gguf_get_val_str = _bind("gguf_get_val_str", ctypes.c_char_p, [gguf_context_p, ctypes.c_int64])
# size_t gguf_get_arr_n(const struct gguf_context * ctx, int64_t key_id);
gguf_get_arr_n = _bind("gguf_get_arr_n", ctypes.c_size_t, [gguf_context_p, ctypes.c_int64])
# const void * gguf_get_arr_data(const struct gguf_context * ctx, int64_t key_id);  (not for string arrays)
gguf_get_arr_data = _bind("gguf_get_arr_data", ctypes.c_void_p, [gguf_context_p, ctypes.c_int64])

_EXPECTED = (
    "ggml_backend_dev_count ggml_backend_dev_get ggml_backend_dev_name ggml_backend_dev_description "
    "ggml_backend_dev_type ggml_backend_dev_memory ggml_backend_dev_buffer_type ggml_backend_dev_host_buffer_type "
    "ggml_backend_cpu_buffer_type ggml_backend_buft_name ggml_type_name gguf_init_from_file gguf_free "
    "gguf_get_data_offset gguf_get_n_tensors gguf_get_tensor_name gguf_get_tensor_type gguf_get_tensor_offset "
    "gguf_get_tensor_size gguf_get_tensor_ne gguf_find_key gguf_get_kv_type gguf_get_arr_type gguf_get_val_u32 "
    "gguf_get_val_i32 gguf_get_val_u64 gguf_get_val_i64 gguf_get_val_u16 gguf_get_val_f32 gguf_get_val_str "
    "gguf_get_arr_n gguf_get_arr_data"
).split()


def check_bindings() -> None:
    """Self-check run at import: every symbol resolved and the CPU buffer type is llama.cpp's own.

    Raises:
        EngineError: a symbol is missing or ggml reports no CPU device (wrong library copy).
    """
    missing = sorted(set(_EXPECTED) - set(_BOUND))
    if missing:
        raise EngineError(f"ggml bindings did not resolve: {missing}")
    cpu_buft = ggml_backend_cpu_buffer_type()
    if not cpu_buft or ggml_backend_buft_name(cpu_buft) != b"CPU":
        raise EngineError("ggml_backend_cpu_buffer_type() is not the CPU buffer type; wrong ggml library copy")
    if ggml_backend_dev_count() < 1:
        raise EngineError("ggml reports no backend device; the llama_cpp libraries are not initialised")


check_bindings()
