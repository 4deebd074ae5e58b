// Unit tests of the msgpack codec, JSON reader, connection file and HMAC signer.
using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;
using Igi.Client;
using Igi.Json;
using Igi.MsgPack;
using Igi.Protocol;

namespace Igi.Tests
{
    public static class CodecTests
    {
        [DllImport("libc", EntryPoint = "chmod", SetLastError = true)]
        private static extern int chmod([MarshalAs(UnmanagedType.LPStr)] string path, uint mode);

        private static void Chmod(string path, int octalMode)
        {
            uint mode = Convert.ToUInt32(octalMode.ToString(), 8);
            Check.Equal(0, chmod(path, mode), "chmod " + octalMode + " " + path + " (errno " + Marshal.GetLastWin32Error() + ")");
        }

        private static byte[] B(params int[] bytes)
        {
            var r = new byte[bytes.Length];
            for (int i = 0; i < bytes.Length; i++) r[i] = (byte)bytes[i];
            return r;
        }

        private static void RoundTrip(object value, string what)
        {
            byte[] data = MsgPackWriter.Encode(value);
            object back = MsgPackReader.Decode(data);
            Check.DeepEqual(value, back, what);
            Check.BytesEqual(data, MsgPackWriter.Encode(back), what + " re-encode");
        }

        public static void Register(TestRunner t)
        {
            t.Add("msgpack:int_smallest_forms", () =>
            {
                var cases = new List<KeyValuePair<long, byte[]>>
                {
                    new KeyValuePair<long, byte[]>(0, B(0x00)),
                    new KeyValuePair<long, byte[]>(127, B(0x7f)),
                    new KeyValuePair<long, byte[]>(128, B(0xcc, 0x80)),
                    new KeyValuePair<long, byte[]>(255, B(0xcc, 0xff)),
                    new KeyValuePair<long, byte[]>(256, B(0xcd, 0x01, 0x00)),
                    new KeyValuePair<long, byte[]>(65535, B(0xcd, 0xff, 0xff)),
                    new KeyValuePair<long, byte[]>(65536, B(0xce, 0x00, 0x01, 0x00, 0x00)),
                    new KeyValuePair<long, byte[]>(4294967295L, B(0xce, 0xff, 0xff, 0xff, 0xff)),
                    new KeyValuePair<long, byte[]>(4294967296L, B(0xcf, 0, 0, 0, 1, 0, 0, 0, 0)),
                    new KeyValuePair<long, byte[]>(long.MaxValue, B(0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)),
                    new KeyValuePair<long, byte[]>(-1, B(0xff)),
                    new KeyValuePair<long, byte[]>(-32, B(0xe0)),
                    new KeyValuePair<long, byte[]>(-33, B(0xd0, 0xdf)),
                    new KeyValuePair<long, byte[]>(-128, B(0xd0, 0x80)),
                    new KeyValuePair<long, byte[]>(-129, B(0xd1, 0xff, 0x7f)),
                    new KeyValuePair<long, byte[]>(-32768, B(0xd1, 0x80, 0x00)),
                    new KeyValuePair<long, byte[]>(-32769, B(0xd2, 0xff, 0xff, 0x7f, 0xff)),
                    new KeyValuePair<long, byte[]>(int.MinValue, B(0xd2, 0x80, 0, 0, 0)),
                    new KeyValuePair<long, byte[]>(int.MinValue - 1L, B(0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff)),
                    new KeyValuePair<long, byte[]>(long.MinValue, B(0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0)),
                };
                foreach (var c in cases)
                {
                    Check.BytesEqual(c.Value, MsgPackWriter.Encode(c.Key), "encode " + c.Key);
                    Check.Equal(c.Key, (long)MsgPackReader.Decode(c.Value), "decode " + c.Key);
                }
                Check.BytesEqual(B(0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), MsgPackWriter.Encode(ulong.MaxValue), "uint64 max");
                Check.Equal(ulong.MaxValue, (ulong)MsgPackReader.Decode(B(0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)), "decode uint64 max");
            });
            t.Add("image:pixels_flip_and_drop_alpha", () =>
            {
                // 1x2 RGBA, bottom row first (Unity) -> top row first RGB (the protocol's raw images)
                byte[] rgba = { 1, 2, 3, 9, 4, 5, 6, 9 };
                Check.BytesEqual(new byte[] { 4, 5, 6, 9, 1, 2, 3, 9 }, ImagePixels.FlipRows(rgba, 1, 2, 4), "flip");
                Check.BytesEqual(new byte[] { 1, 2, 3, 4, 5, 6 }, ImagePixels.DropAlpha(rgba), "drop alpha");
                Check.Throws<ArgumentException>(() => ImagePixels.FlipRows(rgba, 2, 2, 4), "wrong size");
                Check.Throws<ArgumentException>(() => Image.Raw(new byte[11], 2, 2, false), "raw of the wrong length");
                Check.Throws<ArgumentException>(() => Image.Png(new byte[0]), "empty png");
                Image raw = Image.Raw(new byte[12], 2, 2, false);
                Check.Equal("rgb8", raw.Format, "format");
                var w = new MsgPackWriter();
                raw.Write(w);
                var back = Image.Read(new FieldReader(MsgPackReader.Decode(w.ToArray()), "image"));
                Check.Equal(2L, back.Width.Value, "width");
                Check.BytesEqual(raw.Data, back.Data, "data");
                var asText = new MsgPackMap().Add("format", "png").Add("data", "not bin");
                Check.Throws<IgiProtocolException>(() => Image.Read(new FieldReader(asText, "image")), "data as str");
                var gif = new MsgPackMap().Add("format", "gif").Add("data", new byte[] { 1 });
                Check.Throws<IgiProtocolException>(() => Image.Read(new FieldReader(gif, "image")), "unknown format");
            });
            t.Add("msgpack:non_canonical_ints_decode", () =>
            {
                Check.Equal(1L, (long)MsgPackReader.Decode(B(0xce, 0, 0, 0, 1)), "uint32 1");
                Check.Equal(-1L, (long)MsgPackReader.Decode(B(0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)), "int64 -1");
                Check.Equal(5L, (long)MsgPackReader.Decode(B(0xd0, 0x05)), "int8 5");
            });
            t.Add("msgpack:floats", () =>
            {
                Check.BytesEqual(B(0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0), MsgPackWriter.Encode(2.0), "2.0 as float64");
                Check.BytesEqual(B(0xca, 0x3f, 0xc0, 0, 0), MsgPackWriter.Encode(1.5f), "1.5f as float32");
                Check.Equal(1.5f, (float)MsgPackReader.Decode(B(0xca, 0x3f, 0xc0, 0, 0)), "decode float32");
                foreach (double d in new[] { 0.0, -0.0, 1e-300, 1767225600.25, double.MaxValue, double.Epsilon, double.NaN, double.PositiveInfinity })
                    RoundTrip(d, "float64 " + d);
            });
            t.Add("msgpack:str_and_bin_boundaries", () =>
            {
                foreach (int n in new[] { 0, 1, 31, 32, 255, 256, 65535, 65536 })
                {
                    string s = new string('x', n);
                    byte[] enc = MsgPackWriter.Encode(s);
                    int expectedHead = n <= 31 ? 1 : n <= 255 ? 2 : n <= 65535 ? 3 : 5;
                    Check.Equal(expectedHead + n, enc.Length, "str length " + n);
                    RoundTrip(s, "str " + n);
                    var bin = new byte[n];
                    for (int i = 0; i < n; i++) bin[i] = (byte)i;
                    byte[] benc = MsgPackWriter.Encode(bin);
                    Check.Equal((n <= 255 ? 2 : n <= 65535 ? 3 : 5) + n, benc.Length, "bin length " + n);
                    RoundTrip(bin, "bin " + n);
                }
                RoundTrip("héllo クライアント 🎮", "unicode str");
                Check.BytesEqual(B(0xa2, 0xc3, 0xa9), MsgPackWriter.Encode("é"), "utf-8 bytes");
            });
            t.Add("msgpack:containers", () =>
            {
                foreach (int n in new[] { 0, 15, 16, 65535, 65536 })
                {
                    var list = new List<object>();
                    for (int i = 0; i < n; i++) list.Add((long)(i % 200));
                    byte[] enc = MsgPackWriter.Encode(list);
                    Check.Equal(n <= 15 ? (byte)(0x90 | n) : n <= 65535 ? (byte)0xdc : (byte)0xdd, enc[0], "array header " + n);
                    RoundTrip(list, "array " + n);
                }
                foreach (int n in new[] { 0, 15, 16, 70000 })
                {
                    var map = new MsgPackMap();
                    for (int i = 0; i < n; i++) map.Add("k" + i, (long)i);
                    byte[] enc = MsgPackWriter.Encode(map);
                    Check.Equal(n <= 15 ? (byte)(0x80 | n) : n <= 65535 ? (byte)0xde : (byte)0xdf, enc[0], "map header " + n);
                    RoundTrip(map, "map " + n);
                }
                var nested = new MsgPackMap().Add("a", new List<object> { null, true, false, 1L, -2L, 3.5, "s", B(1, 2) })
                                             .Add("b", new MsgPackMap().Add("c", new MsgPackMap()));
                RoundTrip(nested, "nested");
            });
            t.Add("msgpack:map_keeps_wire_order", () =>
            {
                var map = (MsgPackMap)MsgPackReader.Decode(B(0x82, 0xa1, (int)'b', 0x01, 0xa1, (int)'a', 0x02));
                Check.Equal("b", (string)map.Entries[0].Key, "first key");
                Check.Equal(2L, (long)map["a"], "lookup");
            });
            t.Add("msgpack:every_truncation_is_typed", () =>
            {
                var value = new MsgPackMap().Add("text", "hello world").Add("n", 70000L).Add("f", 1.25)
                    .Add("list", new List<object> { 1L, "two", B(3), new MsgPackMap().Add("x", null) });
                byte[] full = MsgPackWriter.Encode(value);
                for (int cut = 0; cut < full.Length; cut++)
                {
                    var prefix = new byte[cut];
                    Buffer.BlockCopy(full, 0, prefix, 0, cut);
                    var e = Check.Throws<MsgPackException>(() => MsgPackReader.Decode(prefix), "prefix " + cut);
                    Check.Equal(MsgPackErrorKind.Truncated, e.Kind, "kind at prefix " + cut);
                }
            });
            t.Add("msgpack:malformed_inputs", () =>
            {
                Check.Equal(MsgPackErrorKind.Malformed, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(B(0xc1)), "0xc1").Kind, "0xc1");
                Check.Equal(MsgPackErrorKind.Malformed, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(B(0xd4, 0x01, 0x00)), "fixext1").Kind, "ext");
                Check.Equal(MsgPackErrorKind.Malformed, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(B(0xc7, 0x01, 0x05, 0x00)), "ext8").Kind, "ext8");
                Check.Equal(MsgPackErrorKind.TrailingBytes, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(B(0x01, 0x02)), "trailing").Kind, "trailing");
                Check.Equal(MsgPackErrorKind.InvalidUtf8, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(B(0xa2, 0xc3, 0x28)), "utf8").Kind, "utf8");
                Check.Equal(MsgPackErrorKind.DuplicateKey, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(B(0x82, 0xa1, (int)'a', 0x01, 0xa1, (int)'a', 0x02)), "dup").Kind, "duplicate key");
                // A container that claims 2^32-1 items in a 5-byte buffer fails fast, without allocating.
                Check.Equal(MsgPackErrorKind.TooLarge, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(B(0xdd, 0xff, 0xff, 0xff, 0xff)), "huge array").Kind, "huge array");
                Check.Equal(MsgPackErrorKind.Truncated, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(B(0xdd, 0x00, 0x0f, 0xff, 0xff)), "long array").Kind, "long array");
                Check.Equal(MsgPackErrorKind.Truncated, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(B(0xdb, 0x7f, 0xff, 0xff, 0xff)), "long str").Kind, "long str");
                Check.Throws<MsgPackException>(() => MsgPackReader.Decode(new byte[0]), "empty buffer");
            });
            t.Add("msgpack:non_string_key_refused_as_soon_as_read", () =>
            {
                // Each key is followed by the reserved byte 0xc1 where its value should be: the key is refused
                // before the value (or the rest of the map) is decoded, so the error is NonStringKey at the key.
                var cases = new Dictionary<string, byte[]>
                {
                    { "int", B(0x82, 0x01, 0xc1, 0xa1, (int)'a', 0x01) },
                    { "uint16", B(0x82, 0xcd, 0x12, 0x34, 0xc1, 0xa1, (int)'a', 0x01) },
                    { "bin", B(0x82, 0xc4, 0x01, 0x61, 0xc1, 0xa1, (int)'a', 0x01) },
                    { "nil", B(0x82, 0xc0, 0xc1, 0xa1, (int)'a', 0x01) },
                    { "map", B(0x82, 0x80, 0xc1, 0xa1, (int)'a', 0x01) },
                    { "array", B(0x82, 0x90, 0xc1, 0xa1, (int)'a', 0x01) },
                };
                foreach (var c in cases)
                {
                    var e = Check.Throws<MsgPackException>(() => MsgPackReader.Decode(c.Value), c.Key + " key");
                    Check.Equal(MsgPackErrorKind.NonStringKey, e.Kind, c.Key + " key kind (" + e.Message + ")");
                    Check.Equal(1, e.Offset, c.Key + " key offset");
                    Check.Equal("invalid_request", e.Classification, c.Key + " key classification");
                }
                // Nested maps too (keys are str at every level).
                var nested = Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(B(0x81, 0xa1, (int)'a', 0x82, 0x07, 0xc1, 0xa1, (int)'b', 0x01)), "nested");
                Check.Equal(MsgPackErrorKind.NonStringKey, nested.Kind, "nested key kind (" + nested.Message + ")");
                Check.Equal(4, nested.Offset, "nested key offset");
                // A map of thousands of distinct int keys is refused at its first key, not after all of them.
                var many = new MsgPackWriter();
                many.WriteMapHeader(16000);
                for (int i = 0; i < 16000; i++) { many.WriteValue((long)(1000 + i)); many.WriteValue(0L); }
                var first = Check.Throws<MsgPackException>(() => MsgPackReader.Decode(many.ToArray()), "16000 int keys");
                Check.Equal(MsgPackErrorKind.NonStringKey, first.Kind, "16000 int keys kind (" + first.Message + ")");
                Check.Equal(3, first.Offset, "16000 int keys refused at the first key");
            });
            t.Add("msgpack:depth_and_size_limits", () =>
            {
                var deep = new byte[40];
                for (int i = 0; i < 39; i++) deep[i] = 0x91;  // [[[[...]]]]
                deep[39] = 0x90;
                Check.Equal(MsgPackErrorKind.TooDeep, Check.Throws<MsgPackException>(() => MsgPackReader.Decode(deep), "deep").Kind, "depth");
                Check.True(MsgPackReader.Decode(deep, new MsgPackLimits { MaxDepth = 64 }) != null, "deep under a larger limit");
                Check.Equal(MsgPackErrorKind.TooLarge, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(new byte[2048], new MsgPackLimits { MaxInputBytes = 1024 }), "size").Kind, "size");
                Check.Equal(MsgPackErrorKind.TooLarge, Check.Throws<MsgPackException>(
                    () => MsgPackReader.Decode(MsgPackWriter.Encode(new List<object> { 1L, 2L, 3L }), new MsgPackLimits { MaxContainerLength = 2 }), "count").Kind, "count");
            });
            t.Add("freeform:keys_sorted_by_utf8_bytes", () =>
            {
                var detail = new MsgPackMap().Add("zeta", 1L).Add("Alpha", new MsgPackMap().Add("y", 2L).Add("x", 3L)).Add("é", 4L).Add("a", 5L);
                var canon = (MsgPackMap)FreeForm.Canonical(detail, 0);
                Check.Equal("Alpha", (string)canon.Entries[0].Key, "uppercase first");
                Check.Equal("a", (string)canon.Entries[1].Key, "then a");
                Check.Equal("zeta", (string)canon.Entries[2].Key, "then zeta");
                Check.Equal("é", (string)canon.Entries[3].Key, "non-ASCII last");
                Check.Equal("x", (string)((MsgPackMap)canon["Alpha"]).Entries[0].Key, "nested sorted");
            });
            t.Add("hmac:rfc4231_case2", () =>
            {
                var signer = new Signer(Encoding.ASCII.GetBytes("Jefe"));
                byte[] sig = signer.Sign(Encoding.ASCII.GetBytes("what do ya want "), Encoding.ASCII.GetBytes("for nothing?"));
                Check.Equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", Encoding.ASCII.GetString(sig), "digest");
                Check.True(signer.Verify(sig, Encoding.ASCII.GetBytes("what do ya want "), Encoding.ASCII.GetBytes("for nothing?")), "verify");
                Check.True(!signer.Verify(sig, Encoding.ASCII.GetBytes("what do ya want"), Encoding.ASCII.GetBytes("for nothing?")), "tampered");
            });
            t.Add("json:mini_parser", () =>
            {
                var d = (Dictionary<string, object>)MiniJson.Parse("{\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\n\\\"\", \"o\": {}}");
                var a = (List<object>)d["a"];
                Check.Equal(1L, (long)a[0], "int");
                Check.Equal(-2500.0, (double)a[1], "float");
                Check.Equal("xé\n\"", (string)d["s"], "escapes");
                foreach (string bad in new[] { "", "{", "{\"a\":}", "[1,]", "{\"a\":1} x", "\"unterminated", "{'a':1}" })
                    Check.Throws<FormatException>(() => MiniJson.Parse(bad), "bad json: " + bad);
            });
            t.Add("connection_file:parse_and_refuse", () =>
            {
                string key = new string('a', 62) + "ff";
                string ok = "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": 5555, \"key\": \"" + key + "\", " +
                            "\"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 42, \"extra\": 1}";
                var info = ConnectionInfo.Parse(ok);
                Check.Equal("tcp://127.0.0.1:5555", info.Endpoint, "endpoint");
                Check.Equal(42, info.Pid, "pid");
                Check.Equal("ipc:///tmp/igi.sock", ConnectionInfo.Parse(
                    "{\"transport\": \"ipc\", \"ip\": \"/tmp/igi.sock\", \"port\": 0, \"key\": \"" + key + "\", \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 1}").Endpoint, "ipc");
                Check.Equal("tcp://[::1]:5555", ConnectionInfo.Parse(ok.Replace("127.0.0.1", "::1")).Endpoint, "an IPv6 host is bracketed");
                foreach (string bad in new[]
                {
                    "{\"transport\": \"ipc\", \"ip\": \"/tmp/igi.sock\", \"port\": 5555, \"key\": \"" + key + "\", \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 1}",
                    "not json", "[]", "{\"ip\": \"127.0.0.1\", \"port\": 1, \"key\": \"00\"}",
                    ok.Replace("hmac-sha256", "hmac-md5"), ok.Replace(key, "xyz"), ok.Replace(key, "00ff"), ok.Replace(key, key + "00"),
                    ok.Replace("5555", "70000"),
                    ok.Replace("\"tcp\"", "\"udp\""), ok.Replace("\"pid\": 42", "\"pid\": \"42\""), ok.Replace(", \"pid\": 42", ""),
                    ok.Replace("\"signature_scheme\": \"hmac-sha256\", ", ""),
                })
                    Check.Throws<IgiConnectionFileException>(() => ConnectionInfo.Parse(bad), "refuse: " + bad);
                Check.Throws<IgiConnectionFileException>(() => ConnectionInfo.Load("/nonexistent/igi.json"), "missing file");
            });
            if (PosixFileMode.IsPosix)
                t.Add("connection_file:refuses_a_file_group_or_others_may_access", () =>
                {
                    // PROTOCOL.md 13: readers SHOULD refuse (POSIX) a file readable or writable by group or others; like the
                    // Python and C++ readers, any of the bits 077 is refused, with the same typed error as other refusals.
                    string key = new string('a', 62) + "ff";
                    string path = Path.Combine(Path.GetTempPath(), "igi-conn-" + Guid.NewGuid().ToString("N") + ".json");
                    File.WriteAllText(path, "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": 5555, \"key\": \"" + key +
                                            "\", \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 42}");
                    try
                    {
                        int permissions;
                        foreach (int ok in new[] { 600, 400, 700 })
                        {
                            Chmod(path, ok);
                            Check.True(PosixFileMode.TryGetPermissions(path, out permissions), "mode " + ok + " read back");
                            Check.Equal(ok.ToString(), Convert.ToString(permissions, 8), "mode read back");
                            Check.Equal(42, ConnectionInfo.Load(path).Pid, "mode " + ok + " accepted");
                        }
                        foreach (int loose in new[] { 640, 604, 620, 602, 610, 601, 644, 666 })
                        {
                            Chmod(path, loose);
                            var e = Check.Throws<IgiConnectionFileException>(() => ConnectionInfo.Load(path), "mode " + loose + " refused");
                            Check.True(e.Message.Contains("has mode " + loose), "the message names the mode: " + e.Message);
                        }
                        Check.Equal(42, ConnectionInfo.Load(path, checkPermissions: false).Pid, "the check can be turned off");
                        Check.Throws<IgiConnectionFileException>(() => IgiClient.Connect(path), "IgiClient.Connect(path) refuses it too");
                        Check.True(!PosixFileMode.TryGetPermissions(path + ".missing", out permissions), "a missing file: unknown");
                        Check.True(!PosixFileMode.TryGetPermissions(Path.GetTempPath(), out permissions), "a directory: not a regular file");
                    }
                    finally
                    {
                        File.Delete(path);
                    }
                });
            else t.Skip("connection_file:refuses_a_file_group_or_others_may_access", "not a POSIX system: the mode is not checked");
            t.Add("protocol:typed_round_trip_all_messages", () =>
            {
                var signer = new Signer(new byte[32]);
                List<KeyValuePair<string, IgiMessage>> messages = AllMessages();
                var covered = new HashSet<string>();
                foreach (var kv in messages) Check.True(covered.Add(kv.Value.Type), "one case per type: " + kv.Value.Type);
                foreach (string type in MessageRegistry.KnownTypes) Check.True(covered.Contains(type), "a round-trip case for " + type);
                Check.Equal(MessageRegistry.KnownTypes.Count, covered.Count, "no case for a type the registry lacks");
                Check.Equal(29, covered.Count, "protocol 1.0 message types");
                foreach (var kv in messages)
                {
                    var header = Header.New(kv.Value.Type, kv.Key);
                    byte[][] frames = WireCodec.Encode(header, kv.Value, signer);
                    Envelope env = WireCodec.Decode(frames, signer);
                    Check.Equal(kv.Value.GetType(), env.Message.GetType(), kv.Value.Type + " decodes to its class");
                    Check.Equal(kv.Key, env.Header.SessionId, kv.Value.Type + " header.session_id");
                    // Every field is set to a non-default value, so a field the reader drops or misreads changes these bytes.
                    byte[][] again = WireCodec.Encode(env.Header, env.Message, signer);
                    foreach (int i in new[] { 3, 2, 0, 1 }) Check.BytesEqual(frames[i], again[i], kv.Value.Type + " frame " + i);  // content first
                }
                var unsorted = new StatusReply { Counters = new MsgPackMap().Add("tokens_total", 5L).Add("bad_frame", 0L), UptimeS = 1.0 };
                var status = (StatusReply)WireCodec.Decode(WireCodec.Encode(Header.New("status_reply"), unsorted, signer), signer).Message;
                Check.Equal("bad_frame", (string)status.Counters.Entries[0].Key, "counters sorted on the wire");
            });
            t.Add("protocol:ids_and_versions_refuse_a_trailing_newline", () =>
            {
                // .NET's $ also matches before a final "\n"; the Python reference refuses all of these.
                var signer = new Signer(new byte[32]);
                string parent = new string('a', 32);
                byte[][] good = WireCodec.Encode(Header.New(CreateSessionReply.TypeName, "npc", parent),
                                                 new CreateSessionReply { SessionId = "npc" }, signer);
                Func<byte[], string, object, byte[]> with = (frame, key, value) =>
                {
                    var copy = new MsgPackMap();
                    foreach (var kv in ((MsgPackMap)MsgPackReader.Decode(frame)).Entries) copy.Add((string)kv.Key, (string)kv.Key == key ? value : kv.Value);
                    return MsgPackWriter.Encode(copy);
                };
                Func<byte[], byte[], byte[][]> frames = (h, c) => new[] { good[0], signer.Sign(h, c), h, c };
                WireCodec.Decode(frames(with(good[2], "msg_id", new string('b', 32)), good[3]), signer);  // the copy itself decodes
                var bad = new List<KeyValuePair<string, byte[][]>>
                {
                    new KeyValuePair<string, byte[][]>("header msg_id", frames(with(good[2], "msg_id", new string('b', 32) + "\n"), good[3])),
                    new KeyValuePair<string, byte[][]>("header parent_id", frames(with(good[2], "parent_id", parent + "\n"), good[3])),
                    new KeyValuePair<string, byte[][]>("header session_id", frames(with(good[2], "session_id", "npc\n"), good[3])),
                    new KeyValuePair<string, byte[][]>("header protocol_version", frames(with(good[2], "protocol_version", "1.0\n"), good[3])),
                    new KeyValuePair<string, byte[][]>("content session_id", frames(good[2], with(good[3], "session_id", "npc\n"))),
                };
                foreach (var kv in bad)
                {
                    var f = kv.Value;
                    var e = Check.Throws<IgiProtocolException>(() => WireCodec.Decode(f, signer), kv.Key + " with a trailing \\n");
                    Check.Equal("invalid_request", e.Classification, kv.Key + " classification (" + e.Message + ")");
                }
                Check.True(FieldReader.IsSessionId("npc"), "npc is a session id");
                Check.True(!FieldReader.IsSessionId("npc\n"), "npc\\n is not a session id");
            });
            t.Add("protocol:budget_levels_and_interim_1_3", () =>
            {
                var signer = new Signer(new byte[32]);
                byte[][] good = WireCodec.Encode(Header.New(SetBudgetRequest.TypeName), new SetBudgetRequest { VramBudgetMib = 2048 }, signer);
                Func<object, bool, byte[][]> levels = (value, present) =>
                {
                    var content = new MsgPackMap().Add("vram_budget_mib", 2048L).Add("reason", "");
                    if (present) content.Add("levels_mib", value);
                    byte[] c = MsgPackWriter.Encode(content);
                    return new[] { good[0], signer.Sign(good[2], c), good[2], c };
                };
                var absent = (SetBudgetRequest)WireCodec.Decode(levels(null, false), signer).Message;
                Check.True(absent.LevelsMib == null, "absent levels_mib (a 1.2 sender) reads as null");
                Check.True(((SetBudgetRequest)WireCodec.Decode(levels(null, true), signer).Message).LevelsMib == null, "nil levels_mib");
                Check.Equal(0, ((SetBudgetRequest)WireCodec.Decode(levels(new List<object>(), true), signer).Message).LevelsMib.Count, "[] clears");
                var sixteen = new List<object>();
                for (int i = 0; i < SetBudgetRequest.MaxLevels; i++) sixteen.Add((long)i * 512);
                sixteen[0] = long.MaxValue;
                Check.Equal(long.MaxValue, ((SetBudgetRequest)WireCodec.Decode(levels(sixteen, true), signer).Message).LevelsMib[0], "16 levels up to 2^63-1");
                var seventeen = new List<object>(sixteen) { 0L };
                var bad = new List<KeyValuePair<string, object>>
                {
                    new KeyValuePair<string, object>("17 levels", seventeen),
                    new KeyValuePair<string, object>("a negative level", new List<object> { 2048L, -1L }),
                    new KeyValuePair<string, object>("a float level", new List<object> { 2048.0 }),
                    new KeyValuePair<string, object>("a bool level", new List<object> { true }),
                    new KeyValuePair<string, object>("not an array", 2048L),
                };
                foreach (var kv in bad)
                {
                    var f = levels(kv.Value, true);
                    var e = Check.Throws<IgiProtocolException>(() => WireCodec.Decode(f, signer), kv.Key);
                    Check.Equal("invalid_request", e.Classification, kv.Key + " classification (" + e.Message + ")");
                }
                var plan = new Plan { Strategy = "cpu_only", Summary = "" };
                var ack = new BudgetAck { RequestedMib = 1, GrantedMib = 1, Applied = true, Plan = plan };
                byte[][] ackFrames = WireCodec.Encode(Header.New(BudgetAck.TypeName, null, new string('a', 32)), ack, signer);
                var withoutInterim = new MsgPackMap();
                foreach (var kv in ((MsgPackMap)MsgPackReader.Decode(ackFrames[3])).Entries)
                    if ((string)kv.Key != "interim") withoutInterim.Add((string)kv.Key, kv.Value);
                byte[] old = MsgPackWriter.Encode(withoutInterim);
                var read = (BudgetAck)WireCodec.Decode(new[] { ackFrames[0], signer.Sign(ackFrames[2], old), ackFrames[2], old }, signer).Message;
                Check.True(read.Interim == null && !read.IsInterim, "absent interim (a 1.2 daemon) reads as null, not interim");
                withoutInterim.Add("interim", 1L);
                byte[] badInterim = MsgPackWriter.Encode(withoutInterim);
                var ei = Check.Throws<IgiProtocolException>(
                    () => WireCodec.Decode(new[] { ackFrames[0], signer.Sign(ackFrames[2], badInterim), ackFrames[2], badInterim }, signer), "interim 1");
                Check.Equal("invalid_request", ei.Classification, "interim 1 classification");
            });
            t.Add("protocol:priority_ageing_1_4", () =>
            {
                Check.Equal("1.4", IgiVersion.Protocol, "the plugin speaks 1.4");
                Check.Equal(0.0, new Limits().PriorityAgeingPerS, "default: strict priority");
                var signer = new Signer(new byte[32]);
                var reply = new HelloReply
                {
                    DaemonVersion = "0.1.0", ProtocolVersion = "1.4", HeartbeatIntervalS = 1.0, ClientTimeoutS = 5.0,
                    Limits = new Limits { MaxQueueDepth = 8, PriorityAgeingPerS = 2.5 },
                };
                byte[][] good = WireCodec.Encode(Header.New(HelloReply.TypeName, null, new string('a', 32)), reply, signer);
                Check.Equal(2.5, ((HelloReply)WireCodec.Decode(good, signer).Message).Limits.PriorityAgeingPerS, "2.5 round trip");
                var content = (MsgPackMap)MsgPackReader.Decode(good[3]);
                var limits = (MsgPackMap)content["limits"];
                Check.Equal("priority_ageing_per_s", limits.Entries[limits.Count - 1].Key, "written last, after max_queue_depth");
                Check.Equal("max_queue_depth", limits.Entries[limits.Count - 2].Key, "max_queue_depth before it");
                // The same hello_reply with limits.priority_ageing_per_s absent (present = false) or set to value.
                Func<object, bool, byte[][]> ageing = (value, present) =>
                {
                    var l = new MsgPackMap();
                    foreach (var kv in limits.Entries)
                        if (kv.Key != "priority_ageing_per_s") l.Add(kv.Key, kv.Value);
                    if (present) l.Add("priority_ageing_per_s", value);
                    var c = new MsgPackMap();
                    foreach (var kv in content.Entries) c.Add(kv.Key, kv.Key == "limits" ? l : kv.Value);
                    byte[] bytes = MsgPackWriter.Encode(c);
                    return new[] { good[0], signer.Sign(good[2], bytes), good[2], bytes };
                };
                Func<byte[][], double> read = f => ((HelloReply)WireCodec.Decode(f, signer).Message).Limits.PriorityAgeingPerS;
                Check.Equal(0.0, read(ageing(null, false)), "absent (a daemon older than 1.4) reads as 0: strict priority");
                Check.Equal(0.0, read(ageing(0.0, true)), "0.0");
                Check.Equal(3.0, read(ageing(3L, true)), "an int is read as a float");
                Check.Equal(1e6, read(ageing(1e6, true)), "no upper bound on the wire");
                var bad = new List<KeyValuePair<string, object>>
                {
                    new KeyValuePair<string, object>("a negative rate", -0.5),
                    new KeyValuePair<string, object>("a str", "1.0"),
                    new KeyValuePair<string, object>("nil", null),
                    new KeyValuePair<string, object>("a bool", true),
                    new KeyValuePair<string, object>("NaN", double.NaN),
                    new KeyValuePair<string, object>("infinity", double.PositiveInfinity),
                };
                foreach (var kv in bad)
                {
                    var f = ageing(kv.Value, true);
                    var e = Check.Throws<IgiProtocolException>(() => WireCodec.Decode(f, signer), kv.Key);
                    Check.Equal("invalid_request", e.Classification, kv.Key + " classification (" + e.Message + ")");
                }
            });
            t.Add("protocol:error_code_table_complete", () =>
            {
                // PROTOCOL.md section 8, as wire strings (not the C# constants), each with the exact class the client raises.
                var expected = new Dictionary<string, Type>
                {
                    { "invalid_request", typeof(IgiInvalidRequestException) },
                    { "unknown_type", typeof(IgiUnknownTypeRemoteException) },
                    { "unsupported_version", typeof(IgiUnsupportedVersionException) },
                    { "too_large", typeof(IgiTooLargeException) },
                    { "busy", typeof(IgiBusyException) },
                    { "not_found", typeof(IgiNotFoundException) },
                    { "no_model", typeof(IgiNoModelException) },
                    { "model_not_found", typeof(IgiModelNotFoundException) },
                    { "model_invalid", typeof(IgiModelInvalidException) },
                    { "budget_infeasible", typeof(IgiBudgetInfeasibleException) },
                    { "engine_failure", typeof(IgiEngineFailureException) },
                    { "cancelled", typeof(IgiCancelledException) },
                    { "timeout", typeof(IgiRemoteTimeoutException) },
                    { "shutting_down", typeof(IgiShuttingDownException) },
                    { "internal", typeof(IgiInternalException) },
                    { "invalid_grammar", typeof(IgiInvalidGrammarException) },
                    { "invalid_schema", typeof(IgiInvalidSchemaException) },
                    { "unknown_tool", typeof(IgiUnknownToolException) },
                    { "invalid_tool_arguments", typeof(IgiInvalidToolArgumentsException) },
                    { "invalid_output", typeof(IgiInvalidOutputException) },
                    { "invalid_image", typeof(IgiInvalidImageException) },
                    { "replayed", typeof(IgiReplayedException) },
                };
                Check.Equal(expected.Count, ErrorCodes.ExceptionFactories.Count, "table size");
                var signer = new Signer(new byte[32]);
                foreach (var kv in expected)
                {
                    Check.True(ErrorCodes.ExceptionFactories.ContainsKey(kv.Key), "the table maps " + kv.Key);
                    Check.Equal(kv.Key, ErrorCodes.Parse(kv.Key), "known code parses to itself");
                    var detail = new MsgPackMap().Add("limit", "x");
                    var reply = new ErrorReply { Code = kv.Key, Message = "m " + kv.Key, Detail = detail, Retryable = true };
                    IgiRemoteException e = ErrorCodes.ToException(reply);
                    Check.Equal(kv.Value, e.GetType(), "exception class for " + kv.Key);
                    Check.Equal(kv.Key, e.Code, "code kept for " + kv.Key);
                    Check.True(e.Message.Contains("m " + kv.Key), "message kept for " + kv.Key + ": " + e.Message);
                    Check.True(e.Retryable, "retryable kept for " + kv.Key);
                    Check.True(ReferenceEquals(detail, e.Detail), "detail kept for " + kv.Key);
                    // The client's path: an error_reply off the wire, decoded, then mapped.
                    var decoded = (ErrorReply)WireCodec.Decode(WireCodec.Encode(Header.New(ErrorReply.TypeName), reply, signer), signer).Message;
                    Check.Equal(kv.Value, ErrorCodes.ToException(decoded).GetType(), "exception class for " + kv.Key + " off the wire");
                }
                // An unknown code (a newer minor version) and a missing one read as internal (PROTOCOL.md section 8).
                foreach (string unknown in new[] { "quota_exceeded", "", null, "BUSY" })
                {
                    IgiRemoteException e = ErrorCodes.ToException(new ErrorReply { Code = unknown, Message = "m" });
                    Check.Equal(typeof(IgiInternalException), e.GetType(), "unknown code '" + unknown + "'");
                    Check.Equal(ErrorCodes.Internal, ErrorCodes.Parse(unknown), "unknown code '" + unknown + "' parses as internal");
                }
                var newer = (ErrorReply)WireCodec.Decode(WireCodec.Encode(Header.New(ErrorReply.TypeName),
                    new ErrorReply { Code = "quota_exceeded", Message = "m" }, signer), signer).Message;
                Check.Equal("internal", newer.Code, "an unknown code off the wire reads as internal");
                Check.Equal(typeof(IgiInternalException), ErrorCodes.ToException(newer).GetType(), "unknown code off the wire");
            });
        }

        // One message of every protocol 1.0 type, every field set to a value other than its default (header session_id first).
        private static List<KeyValuePair<string, IgiMessage>> AllMessages()
        {
            var model = new ModelInfo { Path = "/models/a.gguf", Architecture = "llama", NLayer = 30, NParams = 134515008, FileMib = 88.5, NCtx = 4096 };
            var plan = new Plan { Strategy = "layer_split", GpuMib = 512.5, CpuMib = 100.25, NGpuLayers = 12, Summary = "12/30 layers on the GPU" };
            var sampling = new Sampling { Temperature = 0.3, TopP = 0.9, TopK = 20, Seed = 42, MaxTokens = 64, Stop = new List<string> { "\n\n", "END" } };
            return new List<KeyValuePair<string, IgiMessage>>
            {
                Pair(null, new HelloRequest { ClientName = "game", ClientVersion = "2.3.4", ProtocolVersion = "1.3", Capabilities = new List<string> { "token_stream", "reclaim" } }),
                Pair(null, new HelloReply
                {
                    DaemonVersion = "0.9.1", ProtocolVersion = "1.2", Capabilities = new List<string> { "frame_stats", "session_files" },
                    HeartbeatIntervalS = 2.5, ClientTimeoutS = 15.0,
                    Limits = new Limits { MaxFrameBytes = 2048, MaxPromptTokens = 512, MaxSessions = 3, MaxQueueDepth = 7, PriorityAgeingPerS = 1.5 },
                    Model = model,
                }),
                Pair(null, new LoadModelRequest { ModelPath = "/models/b.gguf", NCtx = 8192, VramBudgetMib = 1024 }),
                Pair(null, new LoadModelReply { Model = model, Plan = plan }),
                Pair(null, new SetBudgetRequest { VramBudgetMib = 2048, Reason = "entering combat", LevelsMib = new List<long> { 6144, 2048, 0 } }),
                Pair(null, new ReclaimRequest { VramBudgetMib = 256, DeadlineS = 0.5 }),
                Pair(null, new BudgetAck
                {
                    RequestedMib = 512, GrantedMib = 256, Applied = true, CpuFallback = true, Plan = plan, PredictedTtftS = 0.2,
                    PredictedTps = 35.5, ApplyTimeS = 1.25, MeasuredVramMib = 240.5, Warning = "deadline_missed", Interim = true,
                }),
                Pair(null, new FrameStatsRequest { FrameTimeMs = 33.3, TargetFrameTimeMs = 16.6, FreeVramMib = 1500.0, GpuBusyPct = 87.5 }),
                Pair(null, new FrameStatsReply { Throttle = new Throttle { TokensPerFrame = 2, SleepMsBetweenTokens = 4.0 }, ProposedBudgetMib = 768 }),
                Pair(null, new CreateSessionRequest { Persona = "Mira", SystemPrompt = "You are Mira, a blacksmith.", Sampling = sampling, Priority = 10 }),
                Pair("npc_1", new CreateSessionReply { SessionId = "npc_1" }),
                Pair("npc_1", new CloseSessionRequest()),
                Pair("npc_1", new CloseSessionReply()),
                Pair("s1", new GenerateRequest { Text = "Hi", MaxTokens = 8, Sampling = Sampling.Greedy(8), Priority = -5 }),
                Pair("s1", new TokenEvent { Index = 3, Text = " forge", TokenId = 1234 }),
                Pair("s1", new GenerateReply
                {
                    FinishReason = FinishReason.Length, Text = "Hello there", Usage = new Usage { PromptTokens = 12, CompletionTokens = 8 },
                    TtftS = 0.05, Tps = 42.5, ReloadsDuring = 1,
                }),
                Pair(null, new CancelRequest { TargetMsgId = Header.NewMsgId() }),
                Pair(null, new CancelReply { Cancelled = true }),
                Pair("npc_1", new SaveSessionRequest { Path = "/tmp/npc_1.igis" }),
                Pair("npc_1", new SaveSessionReply { Path = "/tmp/npc_1.igis" }),
                Pair(null, new LoadSessionRequest { Path = "/tmp/npc_1.igis" }),
                Pair("npc_2", new LoadSessionReply { SessionId = "npc_2", NTurns = 6 }),
                Pair(null, new StatusRequest()),
                Pair(null, new StatusReply
                {
                    Model = model, VramBudgetMib = 4096, Plan = plan, VramUsedMib = 300.5, NSessions = 2, QueueDepth = 1,
                    Counters = new MsgPackMap().Add("bad_frame", 1L).Add("tokens_total", 5L), UptimeS = 12.5,
                }),
                Pair(null, new HeartbeatRequest()),
                Pair(null, new HeartbeatReply { UptimeS = 3.5 }),
                Pair(null, new ShutdownRequest()),
                Pair(null, new ShutdownReply()),
                Pair(null, new ErrorReply { Code = ErrorCodes.Busy, Message = "queue full", Detail = new MsgPackMap().Add("limit", "max_queue_depth"), Retryable = true }),
            };
        }

        private static KeyValuePair<string, IgiMessage> Pair(string session, IgiMessage m)
        {
            return new KeyValuePair<string, IgiMessage>(session, m);
        }
    }
}
