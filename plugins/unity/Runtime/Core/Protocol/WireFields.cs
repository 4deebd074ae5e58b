// Layer: core/protocol. Typed field access on decoded maps, and canonical field writing.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Text;
using System.Text.RegularExpressions;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>
    /// Reads the fields of a decoded content/header map with the protocol's strict typing: integers must
    /// be msgpack ints, floats accept ints (converted) but must be finite, text must be str. Unknown keys are
    /// ignored. Every violation throws <see cref="IgiProtocolException"/> naming the object and field.
    /// </summary>
    public sealed class FieldReader
    {
        // \A and \z, not ^ and $: .NET's $ also matches before a final "\n" ("1.0\n" would pass).
        private static readonly Regex MsgIdPattern = new Regex("\\A[0-9a-f]{32}\\z", RegexOptions.CultureInvariant);
        private static readonly Regex SessionIdPattern = new Regex("\\A[A-Za-z0-9_-]{1,64}\\z", RegexOptions.CultureInvariant);
        private static readonly Regex ToolNamePattern = new Regex("\\A[A-Za-z_][A-Za-z0-9_-]{0,63}\\z", RegexOptions.CultureInvariant);

        /// <summary>Whether <paramref name="sessionId"/> is a valid header.session_id (1-64 of A-Z a-z 0-9 _ -).</summary>
        public static bool IsSessionId(string sessionId) { return sessionId != null && SessionIdPattern.IsMatch(sessionId); }
        private static readonly Regex VersionPattern = new Regex("\\A[0-9]{1,4}\\.[0-9]{1,4}\\z", RegexOptions.CultureInvariant);
        private readonly MsgPackMap _map;
        private readonly string _what;

        /// <summary>Wraps a decoded map; <paramref name="what"/> names it in error messages.</summary>
        public FieldReader(object value, string what)
        {
            _map = value as MsgPackMap;
            _what = what;
            if (_map == null) throw new IgiProtocolException(what + " is a " + TypeName(value) + ", not a map");
        }

        /// <summary>The underlying map.</summary>
        public MsgPackMap Map { get { return _map; } }

        private static string TypeName(object v)
        {
            if (v == null) return "nil";
            if (v is MsgPackMap) return "map";
            if (v is string) return "str";
            if (v is byte[]) return "bin";
            if (v is IList) return "array";
            if (v is bool) return "bool";
            if (v is double || v is float) return "float";
            if (MsgPackValue.IsInteger(v)) return "int";
            return v.GetType().Name;
        }

        private IgiProtocolException Bad(string key, string problem)
        {
            return new IgiProtocolException("invalid " + _what + ": field '" + key + "' " + problem);
        }

        // Returns false when the key is absent (caller applies the default); throws when required and absent.
        private bool Get(string key, bool required, out object value)
        {
            if (_map.TryGetValue(key, out value)) return true;
            if (required) throw Bad(key, "is missing");
            return false;
        }

        /// <summary>Reads a field. Absent: <paramref name="dflt"/> unless <paramref name="required"/>. Nil: null if <paramref name="nullable"/>.</summary>
        public string Str(string key, bool required = true, bool nullable = false, string dflt = null, int maxLength = int.MaxValue)
        {
            object v;
            if (!Get(key, required, out v)) return dflt;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            var s = v as string;
            if (s == null) throw Bad(key, "must be a str, got " + TypeName(v));
            if (CountChars(s) > maxLength) throw Bad(key, "is longer than " + maxLength + " characters");
            return s;
        }

        private static int CountChars(string s)
        {
            int n = 0;
            for (int i = 0; i < s.Length; i++) if (!char.IsLowSurrogate(s[i])) n++;
            return n;
        }

        /// <summary>Reads a str field that must match a regular expression.</summary>
        private string Pattern(string key, Regex pattern, string label, bool required, bool nullable)
        {
            string s = Str(key, required, nullable);
            if (s != null && !pattern.IsMatch(s)) throw Bad(key, "is not a valid " + label + ": '" + s + "'");
            return s;
        }

        /// <summary>A message id (32 lowercase hex digits).</summary>
        public string MsgId(string key, bool nullable = false) { return Pattern(key, MsgIdPattern, "message id", !nullable, nullable); }

        /// <summary>A session id (1-64 of A-Z a-z 0-9 _ -).</summary>
        public string SessionId(string key, bool nullable = false) { return Pattern(key, SessionIdPattern, "session id", !nullable, nullable); }

        /// <summary>A "major.minor" version string.</summary>
        public string Version(string key, bool required = true, string dflt = null) { return Pattern(key, VersionPattern, "version", required, false) ?? dflt; }

        /// <summary>Reads an integer field within [min, max].</summary>
        public long? Int(string key, bool required = true, bool nullable = false, long? dflt = null,
                         long min = long.MinValue, long max = long.MaxValue)
        {
            object v;
            if (!Get(key, required, out v)) return dflt;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            if (!MsgPackValue.IsInteger(v)) throw Bad(key, "must be an int, got " + TypeName(v));
            if (v is ulong) throw Bad(key, "does not fit int64");
            long l = Convert.ToInt64(v);
            if (l < min || l > max) throw Bad(key, "= " + l + " is outside [" + min + ", " + max + "]");
            return l;
        }

        /// <summary>Reads a float64 field (ints accepted and converted), finite, within [min, max].</summary>
        public double? F64(string key, bool required = true, bool nullable = false, double? dflt = null,
                           double min = double.MinValue, double max = double.MaxValue, bool exclusiveMin = false)
        {
            object v;
            if (!Get(key, required, out v)) return dflt;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            double d;
            if (v is double) d = (double)v;
            else if (v is float) d = (float)v;
            else if (MsgPackValue.IsInteger(v) && !(v is ulong)) d = Convert.ToInt64(v);
            else throw Bad(key, "must be a float, got " + TypeName(v));
            if (double.IsNaN(d) || double.IsInfinity(d)) throw Bad(key, "must be finite");
            if (d < min || d > max || (exclusiveMin && d == min)) throw Bad(key, "= " + d + " is out of range");
            return d;
        }

        /// <summary>Reads a bool field.</summary>
        public bool? Bool(string key, bool required = true, bool nullable = false, bool? dflt = null)
        {
            object v;
            if (!Get(key, required, out v)) return dflt;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            if (!(v is bool)) throw Bad(key, "must be a bool, got " + TypeName(v));
            return (bool)v;
        }

        /// <summary>Reads an array of str (absent: empty list).</summary>
        public List<string> StrList(string key, int maxItems = int.MaxValue)
        {
            object v;
            var result = new List<string>();
            if (!Get(key, false, out v)) return result;
            var list = v as IList;
            if (list == null || v is byte[]) throw Bad(key, "must be an array, got " + TypeName(v));
            if (list.Count > maxItems) throw Bad(key, "has more than " + maxItems + " items");
            foreach (object item in list)
            {
                var s = item as string;
                if (s == null) throw Bad(key, "items must be str, got " + TypeName(item));
                result.Add(s);
            }
            return result;
        }

        /// <summary>Reads a nullable array of integers, each within [min, max] (absent or nil: null).</summary>
        public List<long> OptIntList(string key, int maxItems = int.MaxValue, long min = long.MinValue, long max = long.MaxValue)
        {
            object v;
            if (!Get(key, false, out v) || v == null) return null;
            var list = v as IList;
            if (list == null || v is byte[]) throw Bad(key, "must be an array, got " + TypeName(v));
            if (list.Count > maxItems) throw Bad(key, "has more than " + maxItems + " items");
            var result = new List<long>(list.Count);
            for (int i = 0; i < list.Count; i++)
            {
                object item = list[i];
                if (!MsgPackValue.IsInteger(item)) throw Bad(key, "items must be int, got " + TypeName(item));
                if (item is ulong) throw Bad(key, "item " + i + " does not fit int64");
                long l = Convert.ToInt64(item);
                if (l < min || l > max) throw Bad(key, "item " + i + " = " + l + " is outside [" + min + ", " + max + "]");
                result.Add(l);
            }
            return result;
        }

        /// <summary>A tool name (1-64 of A-Z a-z 0-9 _ -, not starting with a digit or '-'; protocol 1.1).</summary>
        public string ToolName(string key) { return Pattern(key, ToolNamePattern, "tool name", true, false); }

        /// <summary>A nullable tool name (null when absent or nil).</summary>
        public string OptToolName(string key) { return Pattern(key, ToolNamePattern, "tool name", false, true); }

        /// <summary>A nullable str of at least <paramref name="minLength"/> and at most <paramref name="maxLength"/> characters.</summary>
        public string OptText(string key, int minLength, int maxLength)
        {
            string s = Str(key, false, true, null, maxLength);
            if (s != null && CountChars(s) < minLength) throw Bad(key, "is shorter than " + minLength + " characters");
            return s;
        }

        /// <summary>Reads an array of nested objects (absent: empty list).</summary>
        public List<T> ObjList<T>(string key, Func<FieldReader, T> read, int maxItems = int.MaxValue) where T : class
        {
            object v;
            var result = new List<T>();
            if (!Get(key, false, out v)) return result;
            var list = v as IList;
            if (list == null || v is byte[]) throw Bad(key, "must be an array, got " + TypeName(v));
            if (list.Count > maxItems) throw Bad(key, "has more than " + maxItems + " items");
            for (int i = 0; i < list.Count; i++) result.Add(read(new FieldReader(list[i], _what + "." + key + "[" + i + "]")));
            return result;
        }

        /// <summary>Reads a bin field (msgpack bin only: a str is a type error). Absent: null unless required.</summary>
        public byte[] Bin(string key, bool required = true, bool nullable = false, int minLength = 0)
        {
            object v;
            if (!Get(key, required, out v)) return null;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            var b = v as byte[];
            if (b == null) throw Bad(key, "must be bin, got " + TypeName(v));
            if (b.Length < minLength) throw Bad(key, "must hold at least " + minLength + " bytes");
            return b;
        }

        /// <summary>Reads a nested object with <paramref name="read"/>.</summary>
        public T Obj<T>(string key, Func<FieldReader, T> read, bool required = true, bool nullable = false, Func<T> dflt = null) where T : class
        {
            object v;
            if (!Get(key, required, out v)) return dflt != null ? dflt() : null;
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            return read(new FieldReader(v, _what + "." + key));
        }

        /// <summary>Reads a free-form map (str keys), returned with keys sorted canonically.</summary>
        public MsgPackMap FreeMap(string key, bool required = false, bool nullable = true)
        {
            object v;
            if (!Get(key, required, out v)) return nullable ? null : new MsgPackMap();
            if (v == null) { if (nullable) return null; throw Bad(key, "must not be nil"); }
            if (!(v is MsgPackMap)) throw Bad(key, "must be a map, got " + TypeName(v));
            try { return (MsgPackMap)FreeForm.Canonical(v, 0); }
            catch (ArgumentException e) { throw Bad(key, e.Message); }
        }
    }

    /// <summary>Writes a content or header map: keys in the order written, nil for null optionals.</summary>
    public sealed class FieldWriter
    {
        private readonly MsgPackWriter _w;

        /// <summary>Starts a map of <paramref name="fieldCount"/> entries on <paramref name="writer"/>.</summary>
        public FieldWriter(MsgPackWriter writer, int fieldCount)
        {
            _w = writer;
            _w.WriteMapHeader(fieldCount);
        }

        /// <summary>Writes a str (or nil) field.</summary>
        public FieldWriter Str(string key, string value) { _w.WriteString(key); _w.WriteString(value); return this; }

        /// <summary>Writes an int (or nil) field in its smallest form.</summary>
        public FieldWriter Int(string key, long? value)
        {
            _w.WriteString(key);
            if (value.HasValue) _w.WriteInt(value.Value); else _w.WriteNil();
            return this;
        }

        /// <summary>Writes a float64 (or nil) field.</summary>
        public FieldWriter F64(string key, double? value)
        {
            _w.WriteString(key);
            if (value.HasValue) _w.WriteFloat64(value.Value); else _w.WriteNil();
            return this;
        }

        /// <summary>Writes a bool field.</summary>
        public FieldWriter Bool(string key, bool? value)
        {
            _w.WriteString(key);
            if (value.HasValue) _w.WriteBool(value.Value); else _w.WriteNil();
            return this;
        }

        /// <summary>Writes an array of str.</summary>
        public FieldWriter StrList(string key, IList<string> values)
        {
            _w.WriteString(key);
            values = values ?? new List<string>();
            _w.WriteArrayHeader(values.Count);
            foreach (string s in values) _w.WriteString(s);
            return this;
        }

        /// <summary>Writes an array of integers, each in its smallest form, or nil for null.</summary>
        public FieldWriter IntList(string key, IList<long> values)
        {
            _w.WriteString(key);
            if (values == null) { _w.WriteNil(); return this; }
            _w.WriteArrayHeader(values.Count);
            foreach (long l in values) _w.WriteInt(l);
            return this;
        }

        /// <summary>Writes an array of nested wire objects.</summary>
        public FieldWriter ObjList<T>(string key, IList<T> values) where T : IWireObject
        {
            _w.WriteString(key);
            int n = values == null ? 0 : values.Count;
            _w.WriteArrayHeader(n);
            for (int i = 0; i < n; i++) values[i].Write(_w);
            return this;
        }

        /// <summary>Writes a bin (or nil) field.</summary>
        public FieldWriter Bin(string key, byte[] value) { _w.WriteString(key); _w.WriteBinary(value); return this; }

        /// <summary>Writes a nested wire object (or nil).</summary>
        public FieldWriter Obj(string key, IWireObject value)
        {
            _w.WriteString(key);
            if (value == null) _w.WriteNil(); else value.Write(_w);
            return this;
        }

        /// <summary>Writes a free-form map with keys sorted by UTF-8 bytes (or nil).</summary>
        public FieldWriter FreeMap(string key, MsgPackMap value)
        {
            _w.WriteString(key);
            if (value == null) _w.WriteNil(); else _w.WriteValue(FreeForm.Canonical(value, 0));
            return this;
        }
    }

    /// <summary>A value object that writes itself as a canonical msgpack map.</summary>
    public interface IWireObject
    {
        /// <summary>Writes the map, keys in spec order.</summary>
        void Write(MsgPackWriter writer);
    }

    /// <summary>Free-form values (error detail, counters): JSON-like, maps sorted by UTF-8 key bytes.</summary>
    public static class FreeForm
    {
        /// <summary>Deepest nesting accepted inside a free-form map.</summary>
        public const int MaxDepth = 8;

        /// <summary>Checks a free-form value and returns a copy with every map's keys sorted by UTF-8 bytes.</summary>
        /// <exception cref="ArgumentException">A disallowed type, a non-finite float or too deep.</exception>
        public static object Canonical(object value, int depth)
        {
            if (depth > MaxDepth) throw new ArgumentException("nested deeper than " + MaxDepth);
            if (value == null || value is bool || value is string || value is long) return value;
            if (value is ulong) throw new ArgumentException("integer does not fit int64");
            if (MsgPackValue.IsInteger(value)) return Convert.ToInt64(value);
            if (value is double || value is float)
            {
                double d = Convert.ToDouble(value);
                if (double.IsNaN(d) || double.IsInfinity(d)) throw new ArgumentException("floats must be finite");
                return d;
            }
            var map = value as MsgPackMap;
            if (map != null)
            {
                var keys = new List<KeyValuePair<byte[], KeyValuePair<string, object>>>();
                foreach (var kv in map.Entries)
                    keys.Add(new KeyValuePair<byte[], KeyValuePair<string, object>>(Encoding.UTF8.GetBytes(kv.Key), kv));
                keys.Sort((a, b) => CompareBytes(a.Key, b.Key));
                var result = new MsgPackMap();
                foreach (var k in keys) result.TryAdd(k.Value.Key, Canonical(k.Value.Value, depth + 1));
                return result;
            }
            var list = value as IList;
            if (list != null && !(value is byte[]))
            {
                var result = new List<object>(list.Count);
                foreach (object item in list) result.Add(Canonical(item, depth + 1));
                return result;
            }
            throw new ArgumentException("type " + value.GetType().Name + " is not allowed in a free-form map");
        }

        private static int CompareBytes(byte[] a, byte[] b)
        {
            int n = Math.Min(a.Length, b.Length);
            for (int i = 0; i < n; i++) if (a[i] != b[i]) return a[i] - b[i];
            return a.Length - b.Length;
        }
    }
}
