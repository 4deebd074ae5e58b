// Layer: core/msgpack. Bounded msgpack decoder for untrusted input.
using System;
using System.Collections.Generic;
using System.Text;

namespace Igi.MsgPack
{
    /// <summary>
    /// Decodes one msgpack value into the object model: nil = null, bool, integers = long
    /// (ulong only above long.MaxValue), float32 = float, float64 = double, str = string, bin = byte[],
    /// array = List&lt;object&gt;, map = <see cref="MsgPackMap"/>. Ext types, the reserved byte 0xc1 and map keys
    /// other than str are refused. Every failure is a <see cref="MsgPackException"/>; no other exception escapes.
    /// </summary>
    public sealed class MsgPackReader
    {
        private static readonly UTF8Encoding StrictUtf8 = new UTF8Encoding(false, true);
        private readonly byte[] _data;
        private readonly int _end;
        private readonly MsgPackLimits _limits;
        private int _pos;

        private MsgPackReader(byte[] data, MsgPackLimits limits)
        {
            _data = data;
            _end = data.Length;
            _limits = limits;
        }

        /// <summary>Decodes exactly one value that spans the whole buffer.</summary>
        /// <param name="data">The msgpack bytes.</param>
        /// <param name="limits">Bounds to enforce; null means <see cref="MsgPackLimits.Default"/>.</param>
        /// <returns>The decoded value.</returns>
        /// <exception cref="MsgPackException">Truncated, malformed, over-limit or trailing bytes.</exception>
        public static object Decode(byte[] data, MsgPackLimits limits = null)
        {
            if (data == null) throw new ArgumentNullException("data");
            limits = limits ?? MsgPackLimits.Default;
            if (data.Length > limits.MaxInputBytes)
                throw new MsgPackException(MsgPackErrorKind.TooLarge, 0,
                    "buffer of " + data.Length + " bytes exceeds the limit of " + limits.MaxInputBytes);
            var r = new MsgPackReader(data, limits);
            object value = r.ReadValue(1);
            if (r._pos != r._end)
                throw new MsgPackException(MsgPackErrorKind.TrailingBytes, r._pos,
                    (r._end - r._pos) + " bytes after the top-level value");
            return value;
        }

        private void Need(int n)
        {
            if (n < 0 || _end - _pos < n)
                throw new MsgPackException(MsgPackErrorKind.Truncated, _pos,
                    "need " + n + " bytes, " + (_end - _pos) + " left");
        }

        private ulong BigEndian(int n)
        {
            Need(n);
            ulong v = 0;
            for (int i = 0; i < n; i++) v = (v << 8) | _data[_pos++];
            return v;
        }

        private int Length(int n)
        {
            int at = _pos;
            ulong v = BigEndian(n);
            if (v > int.MaxValue) throw new MsgPackException(MsgPackErrorKind.TooLarge, at, "length " + v + " too large");
            return (int)v;
        }

        private object ReadValue(int depth)
        {
            Need(1);
            int at = _pos;
            byte b = _data[_pos++];
            if (b <= 0x7f) return (long)b;
            if (b >= 0xe0) return (long)(sbyte)b;
            if ((b & 0xf0) == 0x80) return ReadMap(b & 0x0f, depth, at);
            if ((b & 0xf0) == 0x90) return ReadArray(b & 0x0f, depth, at);
            if ((b & 0xe0) == 0xa0) return ReadStr(b & 0x1f, at);
            switch (b)
            {
                case 0xc0: return null;
                case 0xc2: return false;
                case 0xc3: return true;
                case 0xc4: return ReadBin(Length(1));
                case 0xc5: return ReadBin(Length(2));
                case 0xc6: return ReadBin(Length(4));
                case 0xca:
                {
                    Need(4);
                    var f = new byte[4];
                    Buffer.BlockCopy(_data, _pos, f, 0, 4);
                    _pos += 4;
                    if (BitConverter.IsLittleEndian) Array.Reverse(f);
                    return BitConverter.ToSingle(f, 0);
                }
                case 0xcb: return BitConverter.Int64BitsToDouble((long)BigEndian(8));
                case 0xcc: return (long)BigEndian(1);
                case 0xcd: return (long)BigEndian(2);
                case 0xce: return (long)BigEndian(4);
                case 0xcf:
                {
                    ulong u = BigEndian(8);
                    if (u <= long.MaxValue) return (long)u;
                    return u;
                }
                case 0xd0: return (long)(sbyte)BigEndian(1);
                case 0xd1: return (long)(short)BigEndian(2);
                case 0xd2: return (long)(int)BigEndian(4);
                case 0xd3: return (long)BigEndian(8);
                case 0xd9: return ReadStr(Length(1), at);
                case 0xda: return ReadStr(Length(2), at);
                case 0xdb: return ReadStr(Length(4), at);
                case 0xdc: return ReadArray(Length(2), depth, at);
                case 0xdd: return ReadArray(Length(4), depth, at);
                case 0xde: return ReadMap(Length(2), depth, at);
                case 0xdf: return ReadMap(Length(4), depth, at);
                case 0xc1:
                    throw new MsgPackException(MsgPackErrorKind.Malformed, at, "reserved type byte 0xc1");
                default:
                    // 0xc7-0xc9 ext8/16/32, 0xd4-0xd8 fixext: not used by the protocol.
                    throw new MsgPackException(MsgPackErrorKind.Malformed, at,
                        "ext type byte 0x" + b.ToString("x2") + " is not accepted");
            }
        }

        private string ReadStr(int n, int at)
        {
            Need(n);
            string s;
            try { s = StrictUtf8.GetString(_data, _pos, n); }
            catch (ArgumentException)
            {
                throw new MsgPackException(MsgPackErrorKind.InvalidUtf8, at, "str of " + n + " bytes is not valid UTF-8");
            }
            _pos += n;
            return s;
        }

        private byte[] ReadBin(int n)
        {
            Need(n);
            var result = new byte[n];
            Buffer.BlockCopy(_data, _pos, result, 0, n);
            _pos += n;
            return result;
        }

        private void CheckContainer(int count, int minBytesPerItem, int depth, int at)
        {
            if (depth > _limits.MaxDepth)
                throw new MsgPackException(MsgPackErrorKind.TooDeep, at, "nesting deeper than " + _limits.MaxDepth);
            if (count > _limits.MaxContainerLength)
                throw new MsgPackException(MsgPackErrorKind.TooLarge, at,
                    "container of " + count + " items exceeds the limit of " + _limits.MaxContainerLength);
            // Each item needs at least one byte: a count the buffer cannot hold is a truncation, caught
            // before allocating anything.
            if ((long)count * minBytesPerItem > _end - _pos)
                throw new MsgPackException(MsgPackErrorKind.Truncated, at,
                    "container declares " + count + " items but only " + (_end - _pos) + " bytes remain");
        }

        private List<object> ReadArray(int count, int depth, int at)
        {
            CheckContainer(count, 1, depth, at);
            var list = new List<object>(count);
            for (int i = 0; i < count; i++) list.Add(ReadValue(depth + 1));
            return list;
        }

        private MsgPackMap ReadMap(int count, int depth, int at)
        {
            CheckContainer(count, 2, depth, at);
            var map = new MsgPackMap();
            for (int i = 0; i < count; i++)
            {
                int keyAt = _pos;
                // Keys are str at every level (PROTOCOL.md 5.1): refuse any other key before reading its value.
                object read = ReadValue(depth + 1);
                string key = read as string;
                if (key == null)
                    throw new MsgPackException(MsgPackErrorKind.NonStringKey, keyAt, "non-string map key " + MsgPackValue.ToDebugString(read));
                object value = ReadValue(depth + 1);
                if (!map.TryAdd(key, value) && _limits.RejectDuplicateKeys)
                    throw new MsgPackException(MsgPackErrorKind.DuplicateKey, keyAt, "duplicate map key " + MsgPackValue.ToDebugString(key));
            }
            return map;
        }
    }
}
