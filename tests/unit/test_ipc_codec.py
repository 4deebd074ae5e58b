"""Unit tests of the canonical codec and the typed messages (igi_sdk.ipc.codec / messages)."""

from __future__ import annotations

import math

import msgpack
import pydantic
import pytest
from ipc_golden.cases import SID, VALID_CASES

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.codec import decode, encode, packb, to_wire, unpackb
from igi_sdk.ipc.envelope import Header, new_header
from igi_sdk.ipc.error_codes import RETRYABLE_BY_DEFAULT, ErrorCode, parse_error_code
from igi_sdk.ipc.errors import ProtocolError


def _header(message: m.Message, session_id: str | None = None) -> Header:
    return new_header(message.type, session_id=session_id, msg_id="a" * 32, sent_at=1.0)


@pytest.mark.parametrize("case", VALID_CASES, ids=[c.name for c in VALID_CASES])
def test_round_trip_every_case(case) -> None:  # type: ignore[no-untyped-def]
    header = _header(case.message, case.session_id or SID)
    header_bytes, content_bytes = encode(header, case.message)
    decoded_header, decoded = decode(header_bytes, content_bytes)
    assert decoded_header == header and decoded == case.message
    assert type(decoded) is type(case.message)
    assert encode(decoded_header, decoded) == (header_bytes, content_bytes)


def test_every_type_is_registered_once_and_round_trips_with_defaults() -> None:
    assert len(m.MESSAGE_TYPES) == 29
    for name, cls in m.MESSAGE_TYPES.items():
        assert cls.model_fields["type"].default == name
        assert name.endswith(("_request", "_reply", "_event")) or name == "budget_ack"
        assert cls.model_config["frozen"] and cls.model_config["extra"] == "ignore"
    for request, reply in m.TERMINAL_REPLY.items():
        assert m.MESSAGE_TYPES[request].KIND == "request" and m.MESSAGE_TYPES[reply].KIND == "reply"
    assert m.PRIORITY_TYPES == {"cancel_request", "reclaim_request", "heartbeat_request"}


def test_content_is_written_in_field_order_with_nil_optionals() -> None:
    msg = m.GenerateRequest(text="hi")
    content = unpackb(encode(_header(msg, SID), msg)[1])
    assert list(content) == [
        "text",
        "max_tokens",
        "sampling",
        "priority",
        "grammar",
        "json_schema",
        "tool_choice",
        "tool_result",
        "image",
    ]
    assert content == {
        "text": "hi",
        "max_tokens": None,
        "sampling": None,
        "priority": None,
        "grammar": None,
        "json_schema": None,
        "tool_choice": None,
        "tool_result": None,
        "image": None,
    }
    assert "type" not in content


def test_floats_are_float64_and_ints_smallest() -> None:
    assert packb(to_wire(m.HeartbeatReply(uptime_s=2))) == b"\x81\xa8uptime_s\xcb" + bytes.fromhex("4000000000000000")
    assert packb({"a": 200}) == b"\x81\xa1a\xcc\xc8"  # uint8, not int16
    assert packb({"a": -33}) == b"\x81\xa1a\xd0\xdf"  # int8
    assert packb({"a": 2**63 - 1})[-9:] == b"\xcf\x7f\xff\xff\xff\xff\xff\xff\xff"  # uint64 form


def test_int_accepted_for_float_and_converted() -> None:
    msg = m.FrameStatsRequest(frame_time_ms=16, target_frame_time_ms=16)
    assert isinstance(msg.frame_time_ms, float)
    raw = packb({"frame_time_ms": 16, "target_frame_time_ms": 17})
    _, decoded = decode(encode(_header(msg), msg)[0], raw)
    assert isinstance(decoded, m.FrameStatsRequest) and decoded.target_frame_time_ms == 17.0
    assert isinstance(decoded.target_frame_time_ms, float)


def test_unknown_fields_are_ignored_at_every_level() -> None:
    msg = m.CreateSessionRequest(persona="p", system_prompt="s")
    content = to_wire(msg)
    content["future"] = [1, 2]
    content["sampling"]["mirostat"] = 2
    header = to_wire(_header(msg)) | {"trace_id": "x"}
    decoded_header, decoded = decode(packb(header), packb(content))
    assert decoded == msg and decoded_header == _header(msg)


def test_unknown_type_raises_unknown_type_with_header() -> None:
    header = to_wire(_header(m.StatusRequest())) | {"type": "teleport_request"}
    with pytest.raises(ProtocolError) as info:
        decode(packb(header), packb({}))
    assert info.value.code is ErrorCode.UNKNOWN_TYPE
    assert info.value.header is not None and info.value.header.msg_id == "a" * 32


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"vram_budget_mib": "1"}, "vram_budget_mib"),
        ({"vram_budget_mib": True}, "vram_budget_mib"),
        ({"vram_budget_mib": 1.0}, "vram_budget_mib"),
        ({"vram_budget_mib": 2**63}, "vram_budget_mib"),
        ({"vram_budget_mib": 1, "reason": None}, "reason"),
        ({}, "vram_budget_mib"),
        # 1.3: levels_mib is nil or at most 16 U63s, like vram_budget_mib
        ({"vram_budget_mib": 1, "levels_mib": list(range(17))}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": [2048, -1]}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": [2**63]}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": [2048.0]}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": [True]}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": ["2048"]}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": 2048}, "levels_mib"),
        ({"vram_budget_mib": 1, "levels_mib": {"menu": 6144}}, "levels_mib"),
    ],
)
def test_strict_types_give_invalid_request(content: dict[str, object], fragment: str) -> None:
    header = _header(m.SetBudgetRequest(vram_budget_mib=1))
    with pytest.raises(ProtocolError) as info:
        decode(encode(header, m.SetBudgetRequest(vram_budget_mib=1))[0], packb(content))
    assert info.value.code is ErrorCode.INVALID_REQUEST and fragment in info.value.message
    assert info.value.header == header


def test_session_required_types_need_header_session_id() -> None:
    msg = m.GenerateRequest(text="x")
    with pytest.raises(ProtocolError, match="requires header.session_id"):
        decode(*encode(_header(msg), msg))
    assert decode(*encode(_header(msg, SID), msg))[1] == msg


def test_encode_refuses_mismatched_header_type() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(_header(m.StatusRequest()), m.HeartbeatRequest())
    assert info.value.code is ErrorCode.INVALID_REQUEST


def test_too_large_frame() -> None:
    msg = m.GenerateRequest(text="x" * 5000)
    header_bytes, content_bytes = encode(_header(msg, SID), msg)
    with pytest.raises(ProtocolError) as info:
        decode(header_bytes, content_bytes, max_frame_bytes=4096)
    assert info.value.code is ErrorCode.TOO_LARGE and info.value.header is not None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\x80\x80",
        b"\x91" * 5000,
        b"\xd6\xff\x00\x00\x00\x00",
        b"\xa2\xff\xfe",
        b"\x81\x01\x02",
        b"\x92\x01\x02",
    ],
)
def test_malformed_header_is_invalid_request(data: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(data, b"\x80")
    assert info.value.code is ErrorCode.INVALID_REQUEST and info.value.header is None


def test_duplicate_map_keys_are_invalid_request_at_every_level() -> None:
    """A repeated key is refused, not resolved to its last value (the C# and C++ decoders refuse it too)."""
    with pytest.raises(ProtocolError, match="duplicate map key 'a'") as info:
        unpackb(b"\x82\xa1a\x01\xa1a\x01")  # even with equal values
    assert info.value.code is ErrorCode.INVALID_REQUEST
    header = to_wire(_header(m.SetBudgetRequest(vram_budget_mib=1)))
    header_bytes = packb(header)
    twice = b"\x83\xafvram_budget_mib\x01\xa6reason\xa0\xafvram_budget_mib\x02"
    with pytest.raises(ProtocolError) as content:
        decode(header_bytes, twice)
    assert content.value.code is ErrorCode.INVALID_REQUEST and content.value.header is not None
    repeated_type = bytes([header_bytes[0] + 1]) + header_bytes[1:] + packb("type") + packb("status_request")
    with pytest.raises(ProtocolError) as in_header:
        decode(repeated_type, packb({"vram_budget_mib": 1, "reason": ""}))
    assert in_header.value.code is ErrorCode.INVALID_REQUEST and in_header.value.header is None
    nested = b"\x81\xa6detail\x82\xa1x\x01\xa1x\x02"
    with pytest.raises(ProtocolError, match="duplicate map key 'x'"):
        unpackb(nested)
    assert unpackb(b"\x82\xa1a\x01\xa1b\x01") == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    "stamp",
    [msgpack.Timestamp(1, 0), msgpack.Timestamp(1, 5), msgpack.Timestamp(2**34, 0)],
    ids=["timestamp32", "timestamp64", "timestamp96"],
)
def test_the_timestamp_ext_type_is_invalid_request_at_every_level(stamp: msgpack.Timestamp) -> None:
    """PROTOCOL.md 4.7 and 5.1: no ext types, the timestamp (-1) included, which msgpack decodes without asking the
    ext hook; under a key the receiver ignores, nested in maps and arrays, or as a whole frame."""
    msg = m.SetBudgetRequest(vram_budget_mib=1)
    header = to_wire(_header(msg))
    content = to_wire(msg)
    for value in (stamp, [1, stamp], {"x": [{"y": stamp}]}):
        with pytest.raises(ProtocolError, match="timestamp") as in_content:
            decode(packb(header), msgpack.packb(content | {"future": value}))
        assert in_content.value.code is ErrorCode.INVALID_REQUEST and in_content.value.header is not None
        with pytest.raises(ProtocolError, match="timestamp") as in_header:
            decode(msgpack.packb(header | {"trace": value}), packb(content))
        assert in_header.value.code is ErrorCode.INVALID_REQUEST and in_header.value.header is None
    with pytest.raises(ProtocolError, match="timestamp"):
        unpackb(msgpack.packb(stamp))
    with pytest.raises(ProtocolError, match="timestamp"):
        unpackb(msgpack.packb([stamp]))


def test_invalid_header_with_a_valid_msg_id_keeps_it_for_the_reply() -> None:
    good = to_wire(new_header("close_session_request", session_id="npc_1"))
    with pytest.raises(ProtocolError) as info:
        decode(packb(good | {"session_id": "has space"}), b"\x80")
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.header is not None and info.value.header.msg_id == good["msg_id"]
    assert info.value.header.session_id is None
    with pytest.raises(ProtocolError) as bad_id:
        decode(packb(good | {"msg_id": "nope", "session_id": "has space"}), b"\x80")
    assert bad_id.value.header is None


def test_free_maps_are_sorted_and_checked() -> None:
    reply = m.ErrorReply(code=ErrorCode.BUSY, message="m", detail={"b": {"y": 1, "x": [1.5]}, "a": None})
    assert list(reply.detail or {}) == ["a", "b"] and list((reply.detail or {})["b"]) == ["x", "y"]
    content = unpackb(encode(_header(reply), reply)[1])
    assert list(content["detail"]) == ["a", "b"]
    for bad in (
        {"a": math.inf},
        {"a": object()},
        {"a": 2**64},
        {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}},
    ):
        with pytest.raises(ValueError):
            m.ErrorReply(code=ErrorCode.BUSY, message="m", detail=bad)
    status = m.StatusReply(
        model=None,
        vram_budget_mib=None,
        plan=None,
        vram_used_mib=None,
        n_sessions=0,
        queue_depth=0,
        counters={"z": 1, "a": 2},
        uptime_s=0,
    )
    assert list(status.counters) == ["a", "z"]


def test_unknown_error_code_maps_to_internal_and_every_code_has_a_default() -> None:
    assert parse_error_code("from_the_future") is ErrorCode.INTERNAL
    assert parse_error_code("busy") is ErrorCode.BUSY
    with pytest.raises(ValueError):
        parse_error_code(3)
    assert set(RETRYABLE_BY_DEFAULT) == set(ErrorCode)


def test_models_are_frozen() -> None:
    msg = m.SetBudgetRequest(vram_budget_mib=1)
    with pytest.raises(pydantic.ValidationError):
        msg.vram_budget_mib = 2  # type: ignore[misc]


def test_container_files_use_plain_msgpack() -> None:
    # The codec's packb is plain msgpack with bin type, so any msgpack library reads it.
    data = packb({"k": b"\x00", "s": "é", "l": [1, 2.5]})
    assert msgpack.unpackb(data, raw=False) == {"k": b"\x00", "s": "é", "l": [1, 2.5]}


def test_other_major_is_unsupported_version_before_type_lookup() -> None:
    header = to_wire(_header(m.StatusRequest())) | {"protocol_version": "2.0", "type": "warp_request"}
    with pytest.raises(ProtocolError) as info:
        decode(packb(header), packb({"anything": 1}))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert info.value.detail == {"supported": ["1.0", "1.1", "1.2", "1.3", "1.4"]} and info.value.header is not None
    newer_minor = to_wire(_header(m.StatusRequest())) | {"protocol_version": "1.7"}
    assert decode(packb(newer_minor), packb({}))[0].protocol_version == "1.7"


def test_canonical_tree_rejects_non_str_keys() -> None:
    from igi_sdk.ipc.wire_types import canonical_tree

    with pytest.raises(ValueError, match="keys must be strings"):
        canonical_tree({1: 2})


def _ack(**fields: object) -> m.BudgetAck:
    base: dict[str, object] = {
        "requested_mib": 2048,
        "granted_mib": 2048,
        "applied": True,
        "cpu_fallback": False,
        "plan": {"strategy": "cpu_only", "gpu_mib": 0.0, "cpu_mib": 1.0, "n_gpu_layers": None, "summary": ""},
        "predicted_ttft_s": 0.1,
        "predicted_tps": 10.0,
        "apply_time_s": 0.0,
        "measured_vram_mib": None,
    }
    return m.BudgetAck.model_validate(base | fields)


def test_budget_levels_the_limits_are_inclusive() -> None:
    top = (2**63 - 1,) + (0,) * (m.MAX_BUDGET_LEVELS - 1)
    message = m.SetBudgetRequest(vram_budget_mib=0, levels_mib=top)
    assert decode(*encode(_header(message), message))[1] == message
    with pytest.raises(pydantic.ValidationError):
        m.SetBudgetRequest(vram_budget_mib=0, levels_mib=(0,) * (m.MAX_BUDGET_LEVELS + 1))


def test_budget_levels_nil_and_empty_are_distinct_on_the_wire() -> None:
    keep = m.SetBudgetRequest(vram_budget_mib=2048)
    clear = m.SetBudgetRequest(vram_budget_mib=2048, levels_mib=())
    assert keep.levels_mib is None and to_wire(keep)["levels_mib"] is None
    assert to_wire(clear)["levels_mib"] == []
    for message in (keep, clear):
        assert decode(*encode(_header(message), message))[1] == message
    levels = m.SetBudgetRequest(vram_budget_mib=6144, levels_mib=[6144, 2048, 0])  # a list is taken as a tuple
    assert levels.levels_mib == (6144, 2048, 0) and list(to_wire(levels)) == ["vram_budget_mib", "reason", "levels_mib"]


@pytest.mark.parametrize("version", ["1.0", "1.2", None])
def test_a_pre_1_3_set_budget_request_decodes_with_levels_none(version: str | None) -> None:
    header = to_wire(_header(m.SetBudgetRequest(vram_budget_mib=1))) | {"protocol_version": version}
    if version is None:
        del header["protocol_version"]
    decoded_header, message = decode(packb(header), packb({"vram_budget_mib": 2048, "reason": "play"}))
    assert decoded_header.protocol_version == (version or "1.0")
    assert message == m.SetBudgetRequest(vram_budget_mib=2048, reason="play")
    assert isinstance(message, m.SetBudgetRequest) and message.levels_mib is None


def test_budget_ack_interim_absent_is_none_and_true_round_trips() -> None:
    old = _ack()
    content = {k: v for k, v in to_wire(old).items() if k != "interim"}
    header = to_wire(_header(old)) | {"protocol_version": "1.2"}
    decoded = decode(packb(header), packb(content))[1]
    assert isinstance(decoded, m.BudgetAck) and decoded.interim is None and not decoded.interim
    interim = _ack(interim=True)
    assert list(to_wire(interim))[-1] == "interim" and to_wire(interim)["interim"] is True
    assert decode(*encode(_header(interim), interim))[1] == interim
    with pytest.raises(ProtocolError) as info:
        decode(encode(_header(interim), interim)[0], packb(to_wire(interim) | {"interim": 1}))
    assert info.value.code is ErrorCode.INVALID_REQUEST and "interim" in info.value.message


def test_this_package_speaks_1_4_and_every_earlier_minor() -> None:
    from igi_sdk._version import PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS

    assert PROTOCOL_VERSION == "1.4" and SUPPORTED_PROTOCOL_VERSIONS == ("1.0", "1.1", "1.2", "1.3", "1.4")
    assert new_header("status_request").protocol_version == "1.4"
