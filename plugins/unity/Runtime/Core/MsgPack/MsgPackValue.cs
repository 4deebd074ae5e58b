// Layer: core/msgpack. Helpers over the decoded object model: structural equality and debug text.
using System;
using System.Collections;
using System.Globalization;
using System.Text;

namespace Igi.MsgPack
{
    /// <summary>Structural equality and printing for decoded msgpack values.</summary>
    public static class MsgPackValue
    {
        /// <summary>
        /// True when two decoded values are equal: integers by value (long vs ulong too), floats by bits,
        /// byte[] by content, arrays item by item, maps by the same keys in the same order.
        /// </summary>
        public static bool DeepEquals(object a, object b)
        {
            if (a == null || b == null) return a == null && b == null;
            if (IsInteger(a) && IsInteger(b)) return IntegerEquals(a, b);
            if (a is double && b is double)
                return BitConverter.DoubleToInt64Bits((double)a) == BitConverter.DoubleToInt64Bits((double)b);
            if (a is float && b is float)
                return BitConverter.ToInt32(BitConverter.GetBytes((float)a), 0) == BitConverter.ToInt32(BitConverter.GetBytes((float)b), 0);
            if (a is bool && b is bool) return (bool)a == (bool)b;
            if (a is string && b is string) return string.Equals((string)a, (string)b, StringComparison.Ordinal);
            var ba = a as byte[];
            var bb = b as byte[];
            if (ba != null && bb != null)
            {
                if (ba.Length != bb.Length) return false;
                for (int i = 0; i < ba.Length; i++) if (ba[i] != bb[i]) return false;
                return true;
            }
            var ma = a as MsgPackMap;
            var mb = b as MsgPackMap;
            if (ma != null && mb != null)
            {
                if (ma.Count != mb.Count) return false;
                for (int i = 0; i < ma.Count; i++)
                {
                    if (!DeepEquals(ma.Entries[i].Key, mb.Entries[i].Key)) return false;
                    if (!DeepEquals(ma.Entries[i].Value, mb.Entries[i].Value)) return false;
                }
                return true;
            }
            var la = a as IList;
            var lb = b as IList;
            if (la != null && lb != null && !(a is byte[]) && !(b is byte[]))
            {
                if (la.Count != lb.Count) return false;
                for (int i = 0; i < la.Count; i++) if (!DeepEquals(la[i], lb[i])) return false;
                return true;
            }
            return false;
        }

        /// <summary>True for every .NET integer type.</summary>
        public static bool IsInteger(object v)
        {
            return v is long || v is int || v is short || v is sbyte || v is ulong || v is uint || v is ushort || v is byte;
        }

        private static bool IntegerEquals(object a, object b)
        {
            bool aBig = a is ulong && (ulong)a > long.MaxValue;
            bool bBig = b is ulong && (ulong)b > long.MaxValue;
            if (aBig || bBig) return aBig && bBig && (ulong)a == (ulong)b;
            return Convert.ToInt64(a, CultureInfo.InvariantCulture) == Convert.ToInt64(b, CultureInfo.InvariantCulture);
        }

        /// <summary>A compact JSON-like rendering for messages and test output.</summary>
        public static string ToDebugString(object v)
        {
            var sb = new StringBuilder();
            Append(sb, v);
            return sb.ToString();
        }

        private static void Append(StringBuilder sb, object v)
        {
            if (v == null) { sb.Append("nil"); return; }
            if (v is string) { sb.Append('"').Append(((string)v).Replace("\"", "\\\"")).Append('"'); return; }
            if (v is bool) { sb.Append((bool)v ? "true" : "false"); return; }
            if (v is double) { sb.Append(((double)v).ToString("R", CultureInfo.InvariantCulture)); return; }
            if (v is float) { sb.Append(((float)v).ToString("R", CultureInfo.InvariantCulture)).Append('f'); return; }
            var bytes = v as byte[];
            if (bytes != null) { sb.Append("b'").Append(BitConverter.ToString(bytes).Replace("-", "")).Append('\''); return; }
            var map = v as MsgPackMap;
            if (map != null)
            {
                sb.Append('{');
                for (int i = 0; i < map.Count; i++)
                {
                    if (i > 0) sb.Append(", ");
                    Append(sb, map.Entries[i].Key);
                    sb.Append(": ");
                    Append(sb, map.Entries[i].Value);
                }
                sb.Append('}');
                return;
            }
            var list = v as IList;
            if (list != null)
            {
                sb.Append('[');
                for (int i = 0; i < list.Count; i++)
                {
                    if (i > 0) sb.Append(", ");
                    Append(sb, list[i]);
                }
                sb.Append(']');
                return;
            }
            sb.Append(Convert.ToString(v, CultureInfo.InvariantCulture));
        }
    }
}
