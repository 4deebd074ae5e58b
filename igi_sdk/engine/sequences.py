"""Engine layer: the low-level sequence API over one llama_context (batched decode, KV sequence edits).

``BatchDecoder.decode`` takes several sequences' tokens at once, builds one ``llama_batch`` with per-token
``seq_id`` (split into n_batch-sized chunks), and returns the logits row of each sequence's last token.
It also records which tokens each sequence's KV cells hold: the one such record (the batch scheduler reads it to
reuse a matching prefix, a saved state carries it). Continuous batching builds on this.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np

from igi_sdk.engine.prefault import prefault as prefault_pages
from igi_sdk.errors import EngineError

BatchEntry = tuple[int, Sequence[int], int, bool]  # (seq_id, tokens, start_pos, want_logits_for_last)

_DECODE_CODES = {
    1: "no KV cache slot for the batch (context full or fragmented)",
    2: "aborted",
    -1: "invalid input batch",
}


class DecodeError(EngineError):
    """``llama_decode`` returned non-zero; ``code`` is its return value."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code = code
        why = _DECODE_CODES.get(code, "decode failed")
        super().__init__(f"llama_decode returned {code}: {why}" + (f" ({detail})" if detail else ""))


class DecodeAborted(DecodeError):
    """``llama_decode`` returned 2: its abort callback asked it to stop (``LlamaEngine.abort_on_flag``). llama.cpp
    removed the aborted ubatch's positions; earlier chunks of the same call may still be in the KV cache, so the
    caller rolls every entry back to its start position (``BatchScheduler.step`` does)."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(2, detail)


def decode_error(code: int, detail: str) -> DecodeError:
    """The error of a non-zero ``llama_decode`` return value."""
    return DecodeAborted(detail) if code == 2 else DecodeError(code, detail)


class ContextFullError(EngineError):
    """A sequence would grow past its share of the context (n_ctx / n_seq_max tokens)."""


class BatchDecoder:
    """One ``llama_batch`` of n_batch tokens reused for every decode, plus per-sequence token tracking."""

    def __init__(
        self, ctx: llama_cpp.llama_context_p, n_batch: int, n_vocab: int, n_ctx_seq: int, n_seq_max: int
    ) -> None:
        self.ctx = ctx
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.n_batch = n_batch
        self.n_vocab = n_vocab
        self.n_ctx_seq = n_ctx_seq
        self.n_seq_max = n_seq_max
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.tokens: dict[int, list[int]] = {}  # seq_id -> tokens at positions 0..n-1 (what the KV holds)

    def free(self) -> None:
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None  # type: ignore[assignment]

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"seq_id {seq_id} outside 0..{self.n_seq_max - 1} (placement.n_seq_max)")

    def decode(self, entries: Sequence[BatchEntry]) -> dict[int, np.ndarray]:
        """Evaluate new tokens of several sequences in one pass; see ``LlamaEngine.decode``."""
        seen: set[int] = set()
        flat: list[tuple[int, int, int, bool]] = []  # (token, pos, seq, logits)
        for seq_id, toks, start, want in entries:
            self._check_seq(seq_id)
            if seq_id in seen:
                raise ValueError(f"seq_id {seq_id} appears twice in one decode batch")
            seen.add(seq_id)
            if not toks:
                continue
            if start < 0 or start + len(toks) > self.n_ctx_seq:
                raise ContextFullError(
                    f"sequence {seq_id}: positions {start}..{start + len(toks) - 1} exceed its context of "
                    f"{self.n_ctx_seq} tokens (n_ctx / n_seq_max)"
                )
            for i, tok in enumerate(toks):
                if not 0 <= tok < self.n_vocab:
                    raise ValueError(f"token {tok} outside the vocabulary (n_vocab {self.n_vocab})")
                flat.append((int(tok), start + i, seq_id, want and i == len(toks) - 1))
        logits: dict[int, np.ndarray] = {}
        b = self.batch
        for lo in range(0, len(flat), self.n_batch):
            chunk = flat[lo : lo + self.n_batch]
            for i, (tok, pos, seq, want) in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = want
            b.n_tokens = len(chunk)
            rc = llama_cpp.llama_decode(self.ctx, b)
            if rc != 0:
                raise decode_error(rc, f"{len(chunk)} tokens in chunk starting at {lo}")
            wanted = [seq for _tok, _pos, seq, want in chunk if want]
            if wanted:  # the rows of the outputs, in batch order: one copy of them all
                rows = llama_cpp.llama_get_logits(self.ctx)
                if not rows:
                    raise EngineError("llama_get_logits returned NULL")
                out = np.ctypeslib.as_array(rows, shape=(len(wanted) * self.n_vocab,)).copy()
                for j, seq in enumerate(wanted):
                    logits[seq] = out[j * self.n_vocab : (j + 1) * self.n_vocab]
        for seq_id, toks, start, _want in entries:
            if toks:
                self._record(seq_id, start, toks)
        return logits

    def _record(self, seq_id: int, start: int, toks: Sequence[int]) -> None:
        """The KV of ``seq_id`` now holds ``toks`` at ``start..``; a decode token is appended in place (a copy of the
        whole list per token would cost O(context) per sequence and step)."""
        known = self.tokens.setdefault(seq_id, [])
        if start == len(known):
            known.extend(int(t) for t in toks)
            return
        known = known[:start]
        known += [-1] * (start - len(known))  # positions we did not see (unknown tokens)
        self.tokens[seq_id] = known + [int(t) for t in toks]

    def decode_embd(
        self, seq_id: int, embd: np.ndarray, start_pos: int, token: int, want_logits: bool
    ) -> np.ndarray | None:
        """Evaluate embeddings (float32, (n, n_embd): an image chunk) at positions ``start_pos..`` of one
        sequence, in n_batch chunks of their own batch (llama.cpp does not mix tokens and embeddings in one
        batch). ``token`` is what the bookkeeping records for these positions (a negative pseudo token).

        Returns:
            The logits row after the last embedding if ``want_logits``, else None.
        """
        self._check_seq(seq_id)
        if embd.ndim != 2 or embd.dtype != np.float32:
            raise ValueError("embeddings must be a float32 (n_tokens, n_embd) array")
        n, width = embd.shape
        if start_pos < 0 or start_pos + n > self.n_ctx_seq:
            raise ContextFullError(
                f"sequence {seq_id}: image positions {start_pos}..{start_pos + n - 1} exceed its "
                f"context of {self.n_ctx_seq} tokens (n_ctx / n_seq_max)"
            )
        data = np.ascontiguousarray(embd)
        batch = llama_cpp.llama_batch_init(self.n_batch, width, 1)
        row = None
        try:
            for lo in range(0, n, self.n_batch):
                m = min(self.n_batch, n - lo)
                ctypes.memmove(batch.embd, data[lo : lo + m].ctypes.data, m * width * 4)
                for i in range(m):
                    batch.pos[i] = start_pos + lo + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq_id
                    batch.logits[i] = want_logits and lo + i == n - 1
                batch.n_tokens = m
                rc = llama_cpp.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise decode_error(rc, f"{m} image embeddings at position {start_pos + lo}")
                if want_logits and lo + m == n:
                    out = llama_cpp.llama_get_logits_ith(self.ctx, m - 1)
                    if not out:
                        raise EngineError(f"llama_get_logits_ith({m - 1}) returned NULL")
                    row = np.ctypeslib.as_array(out, shape=(self.n_vocab,)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)
        known = self.tokens.get(seq_id, [])[:start_pos]
        known += [-1] * (start_pos - len(known))
        self.tokens[seq_id] = known + [int(token)] * n
        return row

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self._check_seq(seq_id)
        ok = bool(llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1))
        if ok:
            known = self.tokens.get(seq_id, [])
            start = max(p0, 0)
            if p1 < 0 or p1 >= len(known):
                self.tokens[seq_id] = known[:start]
            else:  # a hole in the middle: keep only the contiguous prefix for prefix reuse
                self.tokens[seq_id] = known[:start]
        return ok

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)
        src_tokens = self.tokens.get(src, [])
        if p0 <= 0 and not self.tokens.get(dst):
            self.tokens[dst] = list(src_tokens if p1 < 0 else src_tokens[:p1])
        else:
            self.tokens[dst] = []  # layout unknown: disable prefix reuse for dst

    def seq_clear(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        llama_cpp.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
        self.tokens[seq_id] = []

    def state_get(self, seq_id: int, prefix: bytes = b"", prefault: bool = True) -> bytes:
        """``prefix`` followed by the sequence's state, llama.cpp writing the state straight into the returned
        object (no copy of it: a reload of 4 sequences of 900 tokens of an 8B exports 450 MiB), whose pages are
        faulted in on several threads first (``engine.prefault``; ``prefault`` False: on the copy's first writes)."""
        self._check_seq(seq_id)
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))
        if size == 0:
            raise EngineError(f"llama_state_seq_get_size({seq_id}) returned 0")
        out, address = _new_bytes(len(prefix) + size)
        if prefault:
            prefault_pages(address + len(prefix), size)
        ctypes.memmove(address, prefix, len(prefix))
        target = ctypes.cast(address + len(prefix), ctypes.POINTER(ctypes.c_uint8))
        written = int(llama_cpp.llama_state_seq_get_data(self.ctx, target, size, seq_id))
        if written == 0:
            raise EngineError(f"llama_state_seq_get_data refused sequence {seq_id} (returned 0)")
        return out if written == size else out[: len(prefix) + written]

    def state_set(self, seq_id: int, data: bytes, offset: int, tokens: list[int]) -> None:
        """Load the state held in ``data`` from ``offset`` on (read in place, not copied)."""
        self._check_seq(seq_id)
        self.seq_clear(seq_id)
        size = len(data) - offset
        if size <= 0:
            raise EngineError(f"the state for sequence {seq_id} is empty")
        data = data if type(data) is bytes else bytes(data)  # a bytearray or view (a copy): its storage moves
        source = ctypes.cast(_address_of(data) + offset, ctypes.POINTER(ctypes.c_uint8))  # ``data`` keeps it alive
        read = int(llama_cpp.llama_state_seq_set_data(self.ctx, source, size, seq_id))
        if read == 0:
            self.tokens[seq_id] = []
            raise EngineError(
                f"llama_state_seq_set_data refused the state for sequence {seq_id} (returned 0): flash "
                "attention, K/V cache types or the KV stream layout (n_seq_max) differ from when it was saved"
            )
        self.tokens[seq_id] = list(tokens)


_bytes_uninitialized = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_uninitialized.restype = ctypes.py_object
_bytes_uninitialized.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


def _address_of(data: bytes) -> int:
    """The address of a bytes object's storage (valid while ``data`` lives)."""
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert address is not None
    return address


def _new_bytes(n_bytes: int) -> tuple[bytes, int]:
    """A new bytes object of ``n_bytes`` uninitialised bytes and the address of its storage, for the caller to fill
    before anything else sees it (the C API's ``PyBytes_FromStringAndSize(NULL, n)`` contract): a state is written once,
    in place, with neither a zero fill nor a copy."""
    if n_bytes < 2:  # CPython shares its empty and one-byte objects: never written into
        raise ValueError("a bytes object to fill must be at least 2 bytes long")
    out = _bytes_uninitialized(None, n_bytes)
    return out, _address_of(out)
