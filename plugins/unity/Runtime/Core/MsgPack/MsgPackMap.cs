// Layer: core/msgpack. An insertion-ordered msgpack map (order matters for canonical re-encoding).
using System;
using System.Collections.Generic;

namespace Igi.MsgPack
{
    /// <summary>
    /// A decoded msgpack map that keeps its keys in wire order. Keys are strings (the protocol allows no
    /// other key type, and the reader refuses one); lookups are O(1).
    /// </summary>
    public sealed class MsgPackMap
    {
        private readonly List<KeyValuePair<string, object>> _entries = new List<KeyValuePair<string, object>>();
        private readonly Dictionary<string, int> _stringIndex = new Dictionary<string, int>(StringComparer.Ordinal);

        /// <summary>Number of entries.</summary>
        public int Count { get { return _entries.Count; } }

        /// <summary>The entries in insertion (wire) order.</summary>
        public IList<KeyValuePair<string, object>> Entries { get { return _entries.AsReadOnly(); } }

        /// <summary>Appends an entry; returns false (and appends nothing) when the key is already present.</summary>
        /// <exception cref="ArgumentNullException"><paramref name="key"/> is null.</exception>
        public bool TryAdd(string key, object value)
        {
            if (key == null) throw new ArgumentNullException("key");
            if (_stringIndex.ContainsKey(key)) return false;
            _stringIndex[key] = _entries.Count;
            _entries.Add(new KeyValuePair<string, object>(key, value));
            return true;
        }

        /// <summary>Appends an entry, throwing <see cref="ArgumentException"/> on a duplicate key. Returns this map.</summary>
        public MsgPackMap Add(string key, object value)
        {
            if (!TryAdd(key, value)) throw new ArgumentException("duplicate map key: " + key);
            return this;
        }

        /// <summary>True when the map holds the string key.</summary>
        public bool ContainsKey(string key) { return _stringIndex.ContainsKey(key); }

        /// <summary>Looks up a string key.</summary>
        public bool TryGetValue(string key, out object value)
        {
            int i;
            if (_stringIndex.TryGetValue(key, out i)) { value = _entries[i].Value; return true; }
            value = null;
            return false;
        }

        /// <summary>The value of a string key, or null when absent.</summary>
        public object this[string key]
        {
            get { object v; TryGetValue(key, out v); return v; }
        }
    }
}
