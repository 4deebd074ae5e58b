// Layer: core/json. A small strict JSON reader for the connection file (objects, arrays, strings, numbers, literals).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Igi.Json
{
    /// <summary>
    /// Parses JSON text into Dictionary&lt;string, object&gt;, List&lt;object&gt;, string, double/long, bool, null.
    /// Integers without fraction/exponent become long; other numbers double.
    /// </summary>
    public sealed class MiniJson
    {
        private const int MaxDepth = 64;
        private readonly string _s;
        private int _i;

        private MiniJson(string s) { _s = s; }

        /// <summary>Parses one JSON document.</summary>
        /// <exception cref="FormatException">The text is not valid JSON.</exception>
        public static object Parse(string text)
        {
            if (text == null) throw new ArgumentNullException("text");
            var p = new MiniJson(text);
            p.SkipWs();
            object v = p.Value(0);
            p.SkipWs();
            if (p._i != p._s.Length) throw p.Error("trailing characters");
            return v;
        }

        private FormatException Error(string what)
        {
            return new FormatException("invalid JSON at character " + _i + ": " + what);
        }

        private void SkipWs()
        {
            while (_i < _s.Length && (_s[_i] == ' ' || _s[_i] == '\t' || _s[_i] == '\n' || _s[_i] == '\r')) _i++;
        }

        private object Value(int depth)
        {
            if (depth > MaxDepth) throw Error("nested too deeply");
            if (_i >= _s.Length) throw Error("unexpected end");
            char c = _s[_i];
            if (c == '{') return Obj(depth);
            if (c == '[') return Arr(depth);
            if (c == '"') return Str();
            if (c == '-' || (c >= '0' && c <= '9')) return Num();
            if (Literal("true")) return true;
            if (Literal("false")) return false;
            if (Literal("null")) return null;
            throw Error("unexpected character '" + c + "'");
        }

        private bool Literal(string word)
        {
            if (string.CompareOrdinal(_s, _i, word, 0, word.Length) != 0) return false;
            _i += word.Length;
            return true;
        }

        private Dictionary<string, object> Obj(int depth)
        {
            var d = new Dictionary<string, object>(StringComparer.Ordinal);
            _i++;
            SkipWs();
            if (_i < _s.Length && _s[_i] == '}') { _i++; return d; }
            while (true)
            {
                SkipWs();
                if (_i >= _s.Length || _s[_i] != '"') throw Error("expected a string key");
                string key = Str();
                SkipWs();
                if (_i >= _s.Length || _s[_i] != ':') throw Error("expected ':'");
                _i++;
                SkipWs();
                d[key] = Value(depth + 1);
                SkipWs();
                if (_i >= _s.Length) throw Error("unterminated object");
                if (_s[_i] == ',') { _i++; continue; }
                if (_s[_i] == '}') { _i++; return d; }
                throw Error("expected ',' or '}'");
            }
        }

        private List<object> Arr(int depth)
        {
            var list = new List<object>();
            _i++;
            SkipWs();
            if (_i < _s.Length && _s[_i] == ']') { _i++; return list; }
            while (true)
            {
                SkipWs();
                list.Add(Value(depth + 1));
                SkipWs();
                if (_i >= _s.Length) throw Error("unterminated array");
                if (_s[_i] == ',') { _i++; continue; }
                if (_s[_i] == ']') { _i++; return list; }
                throw Error("expected ',' or ']'");
            }
        }

        private string Str()
        {
            var sb = new StringBuilder();
            _i++;
            while (true)
            {
                if (_i >= _s.Length) throw Error("unterminated string");
                char c = _s[_i++];
                if (c == '"') return sb.ToString();
                if (c < 0x20) throw Error("control character in string");
                if (c != '\\') { sb.Append(c); continue; }
                if (_i >= _s.Length) throw Error("unterminated escape");
                char e = _s[_i++];
                switch (e)
                {
                    case '"': sb.Append('"'); break;
                    case '\\': sb.Append('\\'); break;
                    case '/': sb.Append('/'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'n': sb.Append('\n'); break;
                    case 'r': sb.Append('\r'); break;
                    case 't': sb.Append('\t'); break;
                    case 'u':
                        if (_i + 4 > _s.Length) throw Error("short \\u escape");
                        int code;
                        if (!int.TryParse(_s.Substring(_i, 4), NumberStyles.AllowHexSpecifier, CultureInfo.InvariantCulture, out code))
                            throw Error("bad \\u escape");
                        sb.Append((char)code);
                        _i += 4;
                        break;
                    default: throw Error("unknown escape \\" + e);
                }
            }
        }

        private object Num()
        {
            int start = _i;
            if (_s[_i] == '-') _i++;
            bool isInteger = true;
            while (_i < _s.Length)
            {
                char c = _s[_i];
                if (c >= '0' && c <= '9') { _i++; continue; }
                if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { isInteger = false; _i++; continue; }
                break;
            }
            string text = _s.Substring(start, _i - start);
            long l;
            if (isInteger && long.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out l)) return l;
            double d;
            if (double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out d)) return d;
            throw Error("bad number '" + text + "'");
        }
    }
}
