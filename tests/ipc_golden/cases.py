"""The message cases behind the golden vectors (data only; ``vectors.py`` renders them).

Numbers in ``parent`` refer to the 1-based position of another valid case (its fixed ``msg_id``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import MAGIC
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.signing import sign
from igi_sdk.ipc.values import Limits, ModelInfo, Plan, Sampling, Throttle, Tool, Usage


class Case(NamedTuple):
    """One valid vector: a name, a message, and the header fields that vary."""

    name: str
    message: m.Message
    parent: int | None = None
    session_id: str | None = None


SID = "5e55102d0000400080000000000000a1"
MODEL = ModelInfo(
    path="/home/player/.cache/igi-sdk/SmolLM2-135M-Instruct-Q4_1.gguf",
    architecture="llama",
    n_layer=30,
    n_params=134515008,
    file_mib=88.5,
    n_ctx=2048,
)
PLAN = Plan(strategy="layer_split", gpu_mib=61.25, cpu_mib=27.25, n_gpu_layers=20, summary="20/30 layers on CUDA0")
CPU_PLAN = Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=88.5, n_gpu_layers=None, summary="")
SAMPLING = Sampling(temperature=0.8, top_p=0.9, top_k=50, seed=4294967295, max_tokens=200, stop=("\n\n", "Player:"))
LONG_PROMPT = "You are Mira, the blacksmith of Eldhollow. " * 8  # > 255 bytes: str16
CAPS_MANY = tuple(f"cap_{i:02d}" for i in range(20))  # > 15 items: array16
# 1.1: constrained output and tools
LINE_SCHEMA = (
    '{"type": "object", "properties": {"line": {"type": "string", "maxLength": 120}, '
    '"emotion": {"enum": ["neutral", "happy", "angry", "afraid"]}, "action": {"enum": ["none", "wave", '
    '"attack", "flee"]}}, "required": ["line", "emotion", "action"], "additionalProperties": false}'
)
GIVE_ITEM = Tool(
    name="give_item",
    description="Hand an item from the NPC's inventory to the player.",
    parameters='{"type": "object", "properties": {"item": {"enum": ["sword", "shield", "potion"]}, '
    '"count": {"type": "integer"}}, "required": ["item", "count"]}',
)
SET_FLAG = Tool(name="set_quest_flag", parameters='{"type": "object", "properties": {"flag": {"type": "string"}}}')
# 1.1: images. A real 1x1 PNG (IHDR, IDAT, IEND).
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478"
    "9c63f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
)
YES_NO_GBNF = 'root ::= ("yes" | "no") "."\n'
COUNTERS = {f"c{i:02d}": i * 1000 for i in range(18)} | {"bad_signature": 3, "tokens_total": 2**40, "x_max": 2**63 - 1}

VALID_CASES: list[Case] = [
    Case(
        "hello_request",
        m.HelloRequest(
            client_name="unity-plugin",
            client_version="0.1.0",
            protocol_version="1.0",
            capabilities=("token_stream", "reclaim"),
        ),
    ),
    Case(
        "hello_request_unicode_many_caps",
        m.HelloRequest(
            client_name="Unreal-クライアント-é", client_version="5.4", protocol_version="1.3", capabilities=CAPS_MANY
        ),
    ),
    Case(
        "hello_reply_no_model",
        m.HelloReply(
            daemon_version="0.1.0",
            protocol_version="1.0",
            capabilities=(),
            heartbeat_interval_s=2.0,
            client_timeout_s=10.0,
            limits=Limits(),
            model=None,
        ),
        parent=1,
    ),
    Case(
        "hello_reply_model",
        m.HelloReply(
            daemon_version="0.1.0",
            protocol_version="1.0",
            capabilities=("token_stream", "reclaim", "frame_stats"),
            heartbeat_interval_s=0.5,
            client_timeout_s=5.0,
            limits=Limits(max_frame_bytes=4194304, max_prompt_tokens=2048, max_sessions=8, max_queue_depth=4),
            model=MODEL,
        ),
        parent=2,
    ),
    Case("load_model_request_default", m.LoadModelRequest()),
    Case(
        "load_model_request_path",
        m.LoadModelRequest(model_path="C:\\Games\\Mods\\modèle-ü.gguf", n_ctx=8192, vram_budget_mib=6144),
    ),
    Case("load_model_reply", m.LoadModelReply(model=MODEL, plan=PLAN), parent=5),
    Case("set_budget_request", m.SetBudgetRequest(vram_budget_mib=512, reason="entering combat")),
    Case("set_budget_request_zero", m.SetBudgetRequest(vram_budget_mib=0)),
    Case("reclaim_request", m.ReclaimRequest(vram_budget_mib=128, deadline_s=0.25)),
    Case(
        "budget_ack",
        m.BudgetAck(
            requested_mib=512,
            granted_mib=512,
            applied=True,
            cpu_fallback=False,
            plan=PLAN,
            predicted_ttft_s=0.125,
            predicted_tps=42.5,
            apply_time_s=0.75,
            measured_vram_mib=498.0,
            warning=None,
        ),
        parent=8,
    ),
    Case(
        "budget_ack_cpu_fallback",
        m.BudgetAck(
            requested_mib=128,
            granted_mib=0,
            applied=True,
            cpu_fallback=True,
            plan=CPU_PLAN,
            predicted_ttft_s=0.5,
            predicted_tps=18.0,
            apply_time_s=1.5,
            measured_vram_mib=None,
            warning="deadline_missed",
        ),
        parent=10,
    ),
    Case("frame_stats_request_min", m.FrameStatsRequest(frame_time_ms=16.6, target_frame_time_ms=16.6)),
    Case(
        "frame_stats_request_full",
        m.FrameStatsRequest(frame_time_ms=33.3, target_frame_time_ms=16.6, free_vram_mib=1024.0, gpu_busy_pct=97.5),
    ),
    Case(
        "frame_stats_reply",
        m.FrameStatsReply(throttle=Throttle(tokens_per_frame=2, sleep_ms_between_tokens=4.0), proposed_budget_mib=256),
        parent=14,
    ),
    Case("frame_stats_reply_unthrottled", m.FrameStatsReply(throttle=Throttle()), parent=13),
    Case(
        "create_session_request",
        m.CreateSessionRequest(persona="Mira", system_prompt=LONG_PROMPT, sampling=SAMPLING, priority=-5),
    ),
    Case("create_session_request_defaults", m.CreateSessionRequest(persona="Guard", system_prompt="Be terse.")),
    Case("create_session_reply", m.CreateSessionReply(session_id=SID), parent=17, session_id=SID),
    Case("close_session_request", m.CloseSessionRequest(), session_id=SID),
    Case("close_session_reply", m.CloseSessionReply(), parent=20, session_id=SID),
    Case("generate_request_min", m.GenerateRequest(text="Hello there!"), session_id=SID),
    Case(
        "generate_request_full",
        m.GenerateRequest(
            text="¿Tienes una espada? 剣はある？ 🗡️",
            max_tokens=64,
            sampling=Sampling(temperature=0.0, seed=0),
            priority=100,
        ),
        session_id=SID,
    ),
    Case("token_event_first", m.TokenEvent(index=0, text="Well", token_id=4559), parent=22, session_id=SID),
    Case("token_event_unicode", m.TokenEvent(index=300, text=" 剣", token_id=151645), parent=23, session_id=SID),
    Case("token_event_empty_piece", m.TokenEvent(index=1, text="", token_id=65535), parent=23, session_id=SID),
    Case(
        "generate_reply_stop",
        m.GenerateReply(
            finish_reason="stop",
            text="Well met, traveller.",
            usage=Usage(prompt_tokens=312, completion_tokens=6),
            ttft_s=0.0625,
            tps=55.5,
            reloads_during=0,
        ),
        parent=22,
        session_id=SID,
    ),
    Case(
        "generate_reply_cancelled",
        m.GenerateReply(
            finish_reason="cancelled",
            text="",
            usage=Usage(prompt_tokens=70000, completion_tokens=0),
            ttft_s=None,
            tps=0.0,
            reloads_during=1,
        ),
        parent=23,
        session_id=SID,
    ),
    Case("cancel_request", m.CancelRequest(target_msg_id="00000000000040008000000000000017"), session_id=SID),
    Case("cancel_reply", m.CancelReply(cancelled=True), parent=29, session_id=SID),
    Case("save_session_request_default", m.SaveSessionRequest(), session_id=SID),
    Case("save_session_request_path", m.SaveSessionRequest(path="/tmp/saves/mira.igisession"), session_id=SID),
    Case("save_session_reply", m.SaveSessionReply(path="/tmp/saves/mira.igisession"), parent=32, session_id=SID),
    Case("load_session_request", m.LoadSessionRequest(path="/tmp/saves/mira.igisession")),
    Case("load_session_reply", m.LoadSessionReply(session_id="s-2", n_turns=12), parent=34, session_id="s-2"),
    Case("status_request", m.StatusRequest()),
    Case(
        "status_reply_idle",
        m.StatusReply(
            model=None,
            vram_budget_mib=None,
            plan=None,
            vram_used_mib=None,
            n_sessions=0,
            queue_depth=0,
            counters={},
            uptime_s=0.5,
        ),
        parent=36,
    ),
    Case(
        "status_reply_busy",
        m.StatusReply(
            model=MODEL,
            vram_budget_mib=4096,
            plan=PLAN,
            vram_used_mib=3900.75,
            n_sessions=3,
            queue_depth=2,
            counters=COUNTERS,
            uptime_s=86400.25,
        ),
        parent=36,
    ),
    Case("heartbeat_request", m.HeartbeatRequest()),
    Case("heartbeat_reply", m.HeartbeatReply(uptime_s=12.5), parent=39),
    Case("shutdown_request", m.ShutdownRequest()),
    Case("shutdown_reply", m.ShutdownReply(), parent=41),
    Case(
        "error_reply_minimal",
        m.ErrorReply(
            code=ErrorCode.UNKNOWN_TYPE, message="unknown message type 'teleport_request'", detail=None, retryable=False
        ),
        parent=1,
    ),
    Case(
        "error_reply_detail",
        m.ErrorReply(
            code=ErrorCode.BUDGET_INFEASIBLE,
            message="budget 64 MiB < minimum",
            detail={
                "requested_mib": 64,
                "minimum_mib": 88.5,
                "devices": ["CUDA0", "CPU"],
                "nested": {"z": None, "a": -1, "m": True},
            },
            retryable=False,
        ),
        parent=8,
    ),
    Case(
        "error_reply_busy",
        m.ErrorReply(code=ErrorCode.BUSY, message="queue full", detail={"queue_depth": 16}, retryable=True),
        parent=22,
        session_id=SID,
    ),
    Case(
        "generate_request_image_png",
        m.GenerateRequest(text="What is this?", image=Image(format="png", data=TINY_PNG)),
        session_id=SID,
    ),
    Case(
        "generate_request_image_rgb8",
        m.GenerateRequest(text="Look.", image=Image(format="rgb8", data=bytes(range(256)) * 3, width=16, height=16)),
        session_id=SID,
    ),
    Case(
        "load_model_request_mmproj",
        m.LoadModelRequest(model_path="/models/vlm.gguf", n_ctx=4096, mmproj_path="/models/vlm-mmproj.gguf"),
    ),
    # 1.2: the replay window
    Case(
        "error_reply_replayed",
        m.ErrorReply(
            code=ErrorCode.REPLAYED,
            message="message 00000000000040008000000000000016 refused as replayed (duplicate)",
            detail={"reason": "duplicate", "window_s": 300.0},
            retryable=False,
        ),
        parent=22,
        session_id=SID,
    ),
    # 1.3: declared budget levels, interim placements
    Case(
        "set_budget_request_levels",
        m.SetBudgetRequest(vram_budget_mib=6144, reason="menu", levels_mib=(6144, 2048, 0)),
    ),
    Case("set_budget_request_levels_cleared", m.SetBudgetRequest(vram_budget_mib=3000, levels_mib=())),
    Case(
        "budget_ack_interim",
        m.BudgetAck(
            requested_mib=3000,
            granted_mib=3000,
            applied=True,
            cpu_fallback=False,
            plan=PLAN,
            predicted_ttft_s=0.25,
            predicted_tps=30.0,
            apply_time_s=0.03125,
            measured_vram_mib=1990.5,
            interim=True,
        ),
        parent=51,
    ),
    # 1.4: priority ageing announced
    Case(
        "hello_reply_priority_ageing",
        m.HelloReply(
            daemon_version="0.1.0",
            protocol_version="1.4",
            capabilities=("token_stream", "reclaim"),
            heartbeat_interval_s=1.0,
            client_timeout_s=5.0,
            limits=Limits(max_prompt_tokens=1008, max_queue_depth=8, priority_ageing_per_s=2.5),
            model=MODEL,
        ),
        parent=3,
    ),
]


def _raw_header(n: int, message_type: str, **extra: Any) -> dict[str, Any]:
    base = {
        "msg_id": f"{n:032x}",
        "parent_id": None,
        "session_id": None,
        "type": message_type,
        "protocol_version": "1.0",
        "sent_at": 1767225600.5,
    }
    return base | extra


def _h(raw: dict[str, Any]) -> Header:
    return Header.model_validate(raw)


_H1 = _raw_header(1001, "set_budget_request")
_H2 = _raw_header(1002, "heartbeat_reply", future_field={"x": 1})
_H3 = _raw_header(1003, "hello_request")
_H4 = _raw_header(1004, "generate_request", session_id=SID)
_H5 = {"type": "status_request", "sent_at": 5, "msg_id": f"{1005:032x}"}
_H6 = _raw_header(1006, "error_reply")
# major 1, read as a number (PROTOCOL.md 9.1); keys out of order (a lenient vector's input is not canonical)
_H8 = _raw_header(1008, "generate_reply", session_id=SID, protocol_version="1.0")
_H9 = _raw_header(1009, "create_session_request")
_H7 = {"protocol_version": "01.0"} | _raw_header(1007, "status_request", protocol_version="01.0")
# 1.2 senders: no 1.3 field
_H10 = _raw_header(1010, "set_budget_request", protocol_version="1.2")
_H11 = _raw_header(1011, "budget_ack", protocol_version="1.2", parent_id=f"{1010:032x}")
# a 1.3 daemon: no priority ageing announced
_H12 = _raw_header(1012, "hello_reply", protocol_version="1.3", parent_id=f"{1003:032x}")

#: (name, raw header map, raw content map, expected Header, expected Message).
LENIENT_CASES: list[tuple[str, dict[str, Any], dict[str, Any], Header, m.Message]] = [
    (
        "unknown_content_keys_ignored",
        _H1,
        {"vram_budget_mib": 300, "reason": "x", "priority_hint": [1, 2]},
        _h(_H1),
        m.SetBudgetRequest(vram_budget_mib=300, reason="x"),
    ),
    ("unknown_header_key_and_int_for_float", _H2, {"uptime_s": 7}, _h(_H2), m.HeartbeatReply(uptime_s=7.0)),
    (
        "absent_defaulted_field",
        _H3,
        {"client_name": "c", "client_version": "1", "protocol_version": "1.0"},
        _h(_H3),
        m.HelloRequest(client_name="c", client_version="1", protocol_version="1.0"),
    ),
    (
        "keys_out_of_order_and_type_key_in_content",
        _H4,
        {"priority": None, "type": "generate_request", "sampling": None, "max_tokens": 5, "text": "hi"},
        _h(_H4),
        m.GenerateRequest(text="hi", max_tokens=5),
    ),
    ("header_keys_out_of_order_absent_optionals", _H5, {}, _h(_H5), m.StatusRequest()),
    (
        "unknown_error_code_maps_to_internal",
        _H6,
        {"code": "quota_exceeded", "message": "m", "detail": None, "retryable": True},
        _h(_H6),
        m.ErrorReply(code=ErrorCode.INTERNAL, message="m", retryable=True),
    ),
    ("major_version_with_a_leading_zero", _H7, {}, _h(_H7), m.StatusRequest()),
    (
        "v1_0_generate_reply_without_1_1_fields",
        _H8,
        {
            "finish_reason": "stop",
            "text": "Hi.",
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
            "ttft_s": 0.5,
            "tps": 10.0,
            "reloads_during": 0,
        },
        _h(_H8),
        m.GenerateReply(
            finish_reason="stop", text="Hi.", usage=Usage(prompt_tokens=9, completion_tokens=2), ttft_s=0.5, tps=10.0
        ),
    ),
    (
        "tool_with_defaults_only_a_name",
        _H9,
        {"persona": "p", "system_prompt": "", "tools": [{"name": "wave"}]},
        _h(_H9),
        m.CreateSessionRequest(persona="p", system_prompt="", tools=(Tool(name="wave"),)),
    ),
    (
        "v1_2_set_budget_request_without_levels",
        _H10,
        {"vram_budget_mib": 2048, "reason": "play"},
        _h(_H10),
        m.SetBudgetRequest(vram_budget_mib=2048, reason="play"),
    ),
    (
        "v1_2_budget_ack_without_interim",
        _H11,
        {
            "requested_mib": 2048,
            "granted_mib": 2048,
            "applied": True,
            "cpu_fallback": False,
            "plan": to_wire(PLAN),
            "predicted_ttft_s": 0.25,
            "predicted_tps": 30.0,
            "apply_time_s": 3.5,
            "measured_vram_mib": 2001.0,
            "warning": None,
        },
        _h(_H11),
        m.BudgetAck(
            requested_mib=2048,
            granted_mib=2048,
            applied=True,
            cpu_fallback=False,
            plan=PLAN,
            predicted_ttft_s=0.25,
            predicted_tps=30.0,
            apply_time_s=3.5,
            measured_vram_mib=2001.0,
        ),
    ),
    (
        "v1_3_hello_reply_without_priority_ageing",
        _H12,
        {
            "daemon_version": "0.1.0",
            "protocol_version": "1.3",
            "capabilities": ["token_stream"],
            "heartbeat_interval_s": 1.0,
            "client_timeout_s": 5.0,
            "limits": {"max_frame_bytes": 1048576, "max_prompt_tokens": 1008, "max_sessions": 64, "max_queue_depth": 8},
            "model": None,
        },
        _h(_H12),
        m.HelloReply(
            daemon_version="0.1.0",
            protocol_version="1.3",
            capabilities=("token_stream",),
            heartbeat_interval_s=1.0,
            client_timeout_s=5.0,
            limits=Limits(max_prompt_tokens=1008, max_queue_depth=8),
            model=None,
        ),
    ),
]


def _signed(key: bytes, header: Any, content: Any) -> list[bytes]:
    hb = header if isinstance(header, bytes) else packb(header)
    cb = content if isinstance(content, bytes) else packb(content)
    return [MAGIC, sign(key, hb, cb), hb, cb]


def _with_unknown_key(packed_map: bytes, entry: bytes) -> bytes:
    """A packed fixmap with one more key and value (``entry``, packed) appended."""
    assert 0x80 <= packed_map[0] < 0x8F
    return bytes([packed_map[0] + 1]) + packed_map[1:] + entry


def _invalid(key: bytes) -> list[tuple[str, list[bytes], str]]:
    good_h = _raw_header(2001, "set_budget_request")
    good_c = {"vram_budget_mib": 512, "reason": ""}
    good = _signed(key, good_h, good_c)
    flipped = good[1][:-1] + (b"0" if good[1][-1:] != b"0" else b"1")
    tampered_h = packb(_raw_header(2002, "set_budget_request"))
    sess = _raw_header(2003, "generate_request")
    hello_h = _raw_header(2018, "hello_reply", protocol_version="1.4", parent_id=f"{2001:032x}")

    def hello_c(ageing: Any) -> dict[str, Any]:
        reply = m.HelloReply(
            daemon_version="0.1.0",
            protocol_version="1.4",
            heartbeat_interval_s=1.0,
            client_timeout_s=5.0,
            limits=Limits(),
            model=None,
        )
        content = to_wire(reply)
        return content | {"limits": content["limits"] | {"priority_ageing_per_s": ageing}}

    return [
        ("bad_hmac_flipped_digit", [good[0], flipped, good[2], good[3]], "bad_signature"),
        ("bad_hmac_wrong_key", _signed(bytes(32), good_h, good_c), "bad_signature"),
        ("bad_hmac_header_swapped_after_signing", [good[0], good[1], tampered_h, good[3]], "bad_signature"),
        (
            "bad_hmac_content_changed",
            [good[0], good[1], good[2], packb({"vram_budget_mib": 4096, "reason": ""})],
            "bad_signature",
        ),
        ("wrong_magic", [b"IGI2", *good[1:]], "bad_frame"),
        ("missing_content_frame", good[:3], "bad_frame"),
        ("extra_frame", [*good, b"\x80"], "bad_frame"),
        ("uppercase_hex_signature", [good[0], good[1].upper(), good[2], good[3]], "bad_frame"),
        ("raw_digest_signature", [good[0], bytes.fromhex(good[1].decode()), good[2], good[3]], "bad_frame"),
        ("empty_frames", [], "bad_frame"),
        ("truncated_content", _signed(key, good_h, packb(good_c)[:-3]), "invalid_request"),
        ("trailing_bytes_after_content", _signed(key, good_h, packb(good_c) + b"\xc0"), "invalid_request"),
        ("header_not_a_map", _signed(key, [good_h["msg_id"], "set_budget_request"], good_c), "invalid_request"),
        (
            "header_missing_msg_id",
            _signed(key, {k: v for k, v in good_h.items() if k != "msg_id"}, good_c),
            "invalid_request",
        ),
        ("header_msg_id_not_hex", _signed(key, good_h | {"msg_id": "not-a-uuid"}, good_c), "invalid_request"),
        ("header_sent_at_string", _signed(key, good_h | {"sent_at": "2026-01-01"}, good_c), "invalid_request"),
        (
            "field_wrong_type_str_for_int",
            _signed(key, good_h, {"vram_budget_mib": "512", "reason": ""}),
            "invalid_request",
        ),
        (
            "field_wrong_type_bool_for_int",
            _signed(key, good_h, {"vram_budget_mib": True, "reason": ""}),
            "invalid_request",
        ),
        (
            "field_wrong_type_float_for_int",
            _signed(key, good_h, {"vram_budget_mib": 512.0, "reason": ""}),
            "invalid_request",
        ),
        ("field_out_of_range_negative", _signed(key, good_h, {"vram_budget_mib": -1, "reason": ""}), "invalid_request"),
        ("field_bin_for_str", _signed(key, good_h, {"vram_budget_mib": 1, "reason": b"bytes"}), "invalid_request"),
        ("required_field_missing", _signed(key, good_h, {"reason": "x"}), "invalid_request"),
        ("content_not_a_map", _signed(key, good_h, [512, ""]), "invalid_request"),
        ("content_int_map_key", _signed(key, good_h, b"\x82\x01\xcd\x02\x00\xa6reason\xa0"), "invalid_request"),
        (
            "content_bin_map_key",
            _signed(key, good_h, b"\x82\xc4\x0fvram_budget_mib\x01\xa6reason\xa0"),
            "invalid_request",
        ),
        (
            "content_duplicate_map_key",
            _signed(key, good_h, b"\x83\xafvram_budget_mib\x01\xa6reason\xa0\xafvram_budget_mib\x02"),
            "invalid_request",
        ),
        (
            "invalid_utf8_string",
            _signed(key, good_h, b"\x82\xafvram_budget_mib\x01\xa6reason\xa2\xff\xfe"),
            "invalid_request",
        ),
        (
            "float_nan",
            _signed(key, _raw_header(2004, "heartbeat_reply"), {"uptime_s": float("nan")}),
            "invalid_request",
        ),
        (
            "ext_type_value",
            _signed(key, good_h, b"\x82\xafvram_budget_mib\xd4\x05\x01\xa6reason\xa0"),
            "invalid_request",
        ),
        (  # the timestamp ext type (-1, 32-bit form) under a key a receiver would otherwise ignore
            "ext_timestamp_under_an_unknown_key",
            _signed(key, good_h, b"\x83\xafvram_budget_mib\x01\xa6reason\xa0\xa6future\xd6\xff" + bytes(4)),
            "invalid_request",
        ),
        (  # 64-bit form, in a map in an array
            "ext_timestamp_nested_in_an_array",
            _signed(
                key,
                good_h,
                b"\x83\xafvram_budget_mib\x01\xa6reason\xa0\xa6future\x91\x81\xa2at\xd7\xff" + bytes(8),
            ),
            "invalid_request",
        ),
        (  # 96-bit form, in the header
            "ext_timestamp_in_header",
            _signed(key, _with_unknown_key(packb(good_h), b"\xa5trace\xc7\x0c\xff" + bytes(12)), good_c),
            "invalid_request",
        ),
        (
            "finish_reason_not_in_enum",
            _signed(
                key,
                _raw_header(2005, "generate_reply", session_id=SID),
                to_wire(
                    m.GenerateReply(
                        finish_reason="stop",
                        text="",
                        usage=Usage(prompt_tokens=1, completion_tokens=0),
                        ttft_s=None,
                        tps=0.0,
                    )
                )
                | {"finish_reason": "exploded"},
            ),
            "invalid_request",
        ),
        (
            "generate_request_without_session_id",
            _signed(key, sess, {"text": "hi", "max_tokens": None, "sampling": None, "priority": None}),
            "invalid_request",
        ),
        (
            "tool_name_starting_with_a_digit",
            _signed(
                key,
                _raw_header(2007, "create_session_request"),
                {
                    "persona": "p",
                    "system_prompt": "",
                    "tools": [{"name": "9lives", "description": "", "parameters": "{}"}],
                },
            ),
            "invalid_request",
        ),
        (
            "grammar_empty_string",
            _signed(
                key,
                _raw_header(2008, "generate_request", session_id=SID),
                {"text": "hi", "max_tokens": None, "sampling": None, "priority": None, "grammar": ""},
            ),
            "invalid_request",
        ),
        (
            "too_many_tools",
            _signed(
                key,
                _raw_header(2009, "create_session_request"),
                {"persona": "p", "system_prompt": "", "tools": [{"name": f"t{i}"} for i in range(33)]},
            ),
            "invalid_request",
        ),
        (
            "tool_call_id_with_a_space",
            _signed(
                key,
                _raw_header(2010, "generate_reply", session_id=SID),
                to_wire(
                    m.GenerateReply(
                        finish_reason="tool_call",
                        text="",
                        usage=Usage(prompt_tokens=1, completion_tokens=0),
                        ttft_s=None,
                        tps=0.0,
                    )
                )
                | {"tool_call": {"id": "call 1", "name": "a", "arguments": "{}"}},
            ),
            "invalid_request",
        ),
        (
            "image_data_as_str",
            _signed(
                key,
                _raw_header(2011, "generate_request", session_id=SID),
                {
                    "text": "hi",
                    "max_tokens": None,
                    "sampling": None,
                    "priority": None,
                    "image": {"format": "png", "data": "iVBORw0KGgo=", "width": None, "height": None},
                },
            ),
            "invalid_request",
        ),
        (
            "image_format_unknown",
            _signed(
                key,
                _raw_header(2012, "generate_request", session_id=SID),
                {
                    "text": "hi",
                    "max_tokens": None,
                    "sampling": None,
                    "priority": None,
                    "image": {"format": "gif", "data": b"GIF89a", "width": None, "height": None},
                },
            ),
            "invalid_request",
        ),
        (
            "image_width_zero",
            _signed(
                key,
                _raw_header(2013, "generate_request", session_id=SID),
                {
                    "text": "hi",
                    "max_tokens": None,
                    "sampling": None,
                    "priority": None,
                    "image": {"format": "rgb8", "data": b"\x00\x00\x00", "width": 0, "height": 1},
                },
            ),
            "invalid_request",
        ),
        (
            "generate_request_grammar_and_json_schema",
            _signed(
                key,
                _raw_header(2014, "generate_request", session_id=SID),
                {
                    "text": "hi",
                    "max_tokens": None,
                    "sampling": None,
                    "priority": None,
                    "grammar": 'root ::= "yes"',
                    "json_schema": '{"type": "boolean"}',
                },
            ),
            "invalid_request",
        ),
        (
            "create_session_grammar_and_json_schema",
            _signed(
                key,
                _raw_header(2015, "create_session_request"),
                {
                    "persona": "p",
                    "system_prompt": "",
                    "grammar": 'root ::= "yes"',
                    "json_schema": '{"type": "boolean"}',
                },
            ),
            "invalid_request",
        ),
        (
            "tool_names_not_distinct",
            _signed(
                key,
                _raw_header(2016, "create_session_request"),
                {
                    "persona": "p",
                    "system_prompt": "",
                    "tools": [
                        {"name": "give_item", "description": "", "parameters": "{}"},
                        {"name": "wave", "description": "", "parameters": "{}"},
                        {"name": "give_item", "description": "twice", "parameters": "{}"},
                    ],
                },
            ),
            "invalid_request",
        ),
        (
            "too_many_budget_levels",
            _signed(key, good_h, good_c | {"levels_mib": [256 * i for i in range(17)]}),
            "invalid_request",
        ),
        ("budget_level_negative", _signed(key, good_h, good_c | {"levels_mib": [2048, -1]}), "invalid_request"),
        ("budget_level_float", _signed(key, good_h, good_c | {"levels_mib": [2048.0]}), "invalid_request"),
        ("budget_levels_not_an_array", _signed(key, good_h, good_c | {"levels_mib": 2048}), "invalid_request"),
        (
            "budget_ack_interim_not_a_bool",
            _signed(
                key,
                _raw_header(2017, "budget_ack"),
                to_wire(
                    m.BudgetAck(
                        requested_mib=1,
                        granted_mib=1,
                        applied=True,
                        cpu_fallback=True,
                        plan=CPU_PLAN,
                        predicted_ttft_s=0.0,
                        predicted_tps=0.0,
                        apply_time_s=0.0,
                        measured_vram_mib=None,
                    )
                )
                | {"interim": 1},
            ),
            "invalid_request",
        ),
        ("priority_ageing_negative", _signed(key, hello_h, hello_c(-0.5)), "invalid_request"),
        ("priority_ageing_as_str", _signed(key, hello_h, hello_c("1.0")), "invalid_request"),
        ("header_major_version_2", _signed(key, good_h | {"protocol_version": "2.0"}, good_c), "unsupported_version"),
        ("unknown_type", _signed(key, _raw_header(2006, "teleport_request"), {"where": "moon"}), "unknown_type"),
    ]


#: Callable key -> [(name, frames, expect)]; a function because signatures depend on the key.
INVALID_CASES: Callable[[bytes], list[tuple[str, list[bytes], str]]] = _invalid
