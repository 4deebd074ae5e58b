// Layer: core/msgpack. Canonical msgpack encoder: smallest integer form, str for text, bin for bytes.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Text;

namespace Igi.MsgPack
{
    /// <summary>
    /// Writes msgpack into a growable buffer. Integers use the smallest form (non-negative values use
    /// positive fixint/uint8..64, negative values negative fixint/int8..64), strings the smallest
    /// fixstr/str8/16/32, bytes bin8/16/32, containers fix/16/32 headers: the canonical form of ipc/PROTOCOL.md.
    /// </summary>
    public sealed class MsgPackWriter
    {
        private static readonly UTF8Encoding Utf8 = new UTF8Encoding(false, true);
        private byte[] _buf;
        private int _len;

        /// <summary>Creates a writer with an initial capacity in bytes.</summary>
        public MsgPackWriter(int initialCapacity = 256)
        {
            _buf = new byte[Math.Max(16, initialCapacity)];
        }

        /// <summary>Bytes written so far.</summary>
        public int Length { get { return _len; } }

        /// <summary>A copy of the bytes written so far.</summary>
        public byte[] ToArray()
        {
            var result = new byte[_len];
            Buffer.BlockCopy(_buf, 0, result, 0, _len);
            return result;
        }

        /// <summary>Encodes one value with <see cref="WriteValue"/> and returns the bytes.</summary>
        public static byte[] Encode(object value)
        {
            var w = new MsgPackWriter();
            w.WriteValue(value);
            return w.ToArray();
        }

        private void Ensure(int extra)
        {
            if (_len + extra <= _buf.Length) return;
            int size = _buf.Length * 2;
            while (size < _len + extra) size *= 2;
            Array.Resize(ref _buf, size);
        }

        private void Byte(byte b) { Ensure(1); _buf[_len++] = b; }

        private void BigEndian(ulong v, int nBytes)
        {
            Ensure(nBytes);
            for (int i = nBytes - 1; i >= 0; i--) _buf[_len++] = (byte)(v >> (8 * i));
        }

        private void Raw(byte[] data)
        {
            Ensure(data.Length);
            Buffer.BlockCopy(data, 0, _buf, _len, data.Length);
            _len += data.Length;
        }

        /// <summary>Writes nil.</summary>
        public void WriteNil() { Byte(0xc0); }

        /// <summary>Writes true or false.</summary>
        public void WriteBool(bool value) { Byte(value ? (byte)0xc3 : (byte)0xc2); }

        /// <summary>Writes a signed integer in its smallest form.</summary>
        public void WriteInt(long value)
        {
            if (value >= 0) { WriteUInt((ulong)value); return; }
            if (value >= -32) { Byte((byte)(sbyte)value); return; }
            if (value >= sbyte.MinValue) { Byte(0xd0); BigEndian((ulong)value, 1); return; }
            if (value >= short.MinValue) { Byte(0xd1); BigEndian((ulong)value, 2); return; }
            if (value >= int.MinValue) { Byte(0xd2); BigEndian((ulong)value, 4); return; }
            Byte(0xd3); BigEndian((ulong)value, 8);
        }

        /// <summary>Writes an unsigned integer in its smallest form.</summary>
        public void WriteUInt(ulong value)
        {
            if (value <= 0x7f) { Byte((byte)value); return; }
            if (value <= byte.MaxValue) { Byte(0xcc); BigEndian(value, 1); return; }
            if (value <= ushort.MaxValue) { Byte(0xcd); BigEndian(value, 2); return; }
            if (value <= uint.MaxValue) { Byte(0xce); BigEndian(value, 4); return; }
            Byte(0xcf); BigEndian(value, 8);
        }

        /// <summary>Writes a float64 (the only float form the protocol emits).</summary>
        public void WriteFloat64(double value)
        {
            Byte(0xcb);
            BigEndian((ulong)BitConverter.DoubleToInt64Bits(value), 8);
        }

        /// <summary>Writes a float32 (only used to re-encode decoded float32 values).</summary>
        public void WriteFloat32(float value)
        {
            Byte(0xca);
            byte[] b = BitConverter.GetBytes(value);
            if (BitConverter.IsLittleEndian) Array.Reverse(b);
            Raw(b);
        }

        /// <summary>Writes text as a UTF-8 str; null writes nil.</summary>
        public void WriteString(string value)
        {
            if (value == null) { WriteNil(); return; }
            byte[] data;
            try { data = Utf8.GetBytes(value); }
            catch (EncoderFallbackException e) { throw new ArgumentException("string is not valid UTF-16 (lone surrogate)", e); }
            int n = data.Length;
            if (n <= 31) Byte((byte)(0xa0 | n));
            else if (n <= byte.MaxValue) { Byte(0xd9); BigEndian((ulong)n, 1); }
            else if (n <= ushort.MaxValue) { Byte(0xda); BigEndian((ulong)n, 2); }
            else { Byte(0xdb); BigEndian((ulong)n, 4); }
            Raw(data);
        }

        /// <summary>Writes bytes as bin; null writes nil.</summary>
        public void WriteBinary(byte[] value)
        {
            if (value == null) { WriteNil(); return; }
            int n = value.Length;
            if (n <= byte.MaxValue) { Byte(0xc4); BigEndian((ulong)n, 1); }
            else if (n <= ushort.MaxValue) { Byte(0xc5); BigEndian((ulong)n, 2); }
            else { Byte(0xc6); BigEndian((ulong)n, 4); }
            Raw(value);
        }

        /// <summary>Writes an array header for <paramref name="count"/> items.</summary>
        public void WriteArrayHeader(int count)
        {
            if (count < 0) throw new ArgumentOutOfRangeException("count");
            if (count <= 15) Byte((byte)(0x90 | count));
            else if (count <= ushort.MaxValue) { Byte(0xdc); BigEndian((ulong)count, 2); }
            else { Byte(0xdd); BigEndian((ulong)count, 4); }
        }

        /// <summary>Writes a map header for <paramref name="count"/> entries.</summary>
        public void WriteMapHeader(int count)
        {
            if (count < 0) throw new ArgumentOutOfRangeException("count");
            if (count <= 15) Byte((byte)(0x80 | count));
            else if (count <= ushort.MaxValue) { Byte(0xde); BigEndian((ulong)count, 2); }
            else { Byte(0xdf); BigEndian((ulong)count, 4); }
        }

        /// <summary>
        /// Writes any value of the decoded object model: null, bool, sbyte..long, byte..ulong, float (float32),
        /// double (float64), string, byte[], <see cref="MsgPackMap"/>, IDictionary (enumeration order),
        /// IList / IEnumerable (array).
        /// </summary>
        public void WriteValue(object value)
        {
            if (value == null) { WriteNil(); return; }
            if (value is bool) { WriteBool((bool)value); return; }
            if (value is string) { WriteString((string)value); return; }
            if (value is byte[]) { WriteBinary((byte[])value); return; }
            if (value is long) { WriteInt((long)value); return; }
            if (value is int) { WriteInt((int)value); return; }
            if (value is short) { WriteInt((short)value); return; }
            if (value is sbyte) { WriteInt((sbyte)value); return; }
            if (value is ulong) { WriteUInt((ulong)value); return; }
            if (value is uint) { WriteUInt((uint)value); return; }
            if (value is ushort) { WriteUInt((ushort)value); return; }
            if (value is byte) { WriteUInt((byte)value); return; }
            if (value is double) { WriteFloat64((double)value); return; }
            if (value is float) { WriteFloat32((float)value); return; }
            var map = value as MsgPackMap;
            if (map != null)
            {
                WriteMapHeader(map.Count);
                foreach (var kv in map.Entries) { WriteValue(kv.Key); WriteValue(kv.Value); }
                return;
            }
            var dict = value as IDictionary;
            if (dict != null)
            {
                WriteMapHeader(dict.Count);
                foreach (DictionaryEntry kv in dict) { WriteValue(kv.Key); WriteValue(kv.Value); }
                return;
            }
            var list = value as IList;
            if (list != null)
            {
                WriteArrayHeader(list.Count);
                foreach (object item in list) WriteValue(item);
                return;
            }
            var seq = value as IEnumerable;
            if (seq != null)
            {
                var items = new List<object>();
                foreach (object item in seq) items.Add(item);
                WriteValue(items);
                return;
            }
            throw new ArgumentException("cannot msgpack-encode a value of type " + value.GetType().FullName);
        }
    }
}
