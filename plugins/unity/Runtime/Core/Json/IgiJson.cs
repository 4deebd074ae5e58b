// Layer: core/json. Maps a constrained reply's JSON (generate_reply.json_output, tool_call.arguments) onto a
// [Serializable] class: public fields by name, as UnityEngine.JsonUtility does, without needing UnityEngine.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Globalization;
using System.Reflection;
using Igi.Protocol;

namespace Igi.Json
{
    /// <summary>
    /// <c>IgiJson.FromJson&lt;T&gt;(text)</c> fills a new T's public instance fields from a JSON object: string, bool,
    /// int, long, float, double, enum (by name), nested [Serializable] classes, List&lt;T&gt; and arrays. Keys without a
    /// field are ignored; fields without a key keep their default. In Unity, <c>JsonUtility.FromJson&lt;T&gt;</c> reads the
    /// same text.
    /// </summary>
    public static class IgiJson
    {
        /// <summary>Maps a JSON object onto a new T.</summary>
        /// <exception cref="FormatException">The text is not JSON, or a value does not fit its field.</exception>
        public static T FromJson<T>(string json) where T : new()
        {
            return (T)Convert(MiniJson.Parse(json), typeof(T), "$");
        }

        /// <summary>The reply's JSON (json_output) as a T; default(T) when the reply carried none.</summary>
        public static T Parsed<T>(this GenerateReply reply) where T : new()
        {
            return reply == null || reply.JsonOutput == null ? default(T) : FromJson<T>(reply.JsonOutput);
        }

        /// <summary>The tool call's arguments as a T.</summary>
        public static T ArgumentsAs<T>(this ToolCall call) where T : new()
        {
            return FromJson<T>(call.Arguments);
        }

        private static object Convert(object value, Type type, string path)
        {
            if (value == null) return type.IsValueType ? Activator.CreateInstance(type) : null;
            if (type == typeof(object)) return value;
            if (type == typeof(string))
            {
                var s = value as string;
                if (s == null) throw Bad(path, "a string");
                return s;
            }
            if (type == typeof(bool))
            {
                if (!(value is bool)) throw Bad(path, "a boolean");
                return value;
            }
            if (type.IsEnum)
            {
                var s = value as string;
                if (s == null) throw Bad(path, "an enum name");
                try { return Enum.Parse(type, s, true); }
                catch (ArgumentException) { throw Bad(path, "one of " + string.Join(", ", Enum.GetNames(type))); }
            }
            if (type == typeof(int) || type == typeof(long) || type == typeof(float) || type == typeof(double))
            {
                if (!(value is long) && !(value is double)) throw Bad(path, "a number");
                try { return System.Convert.ChangeType(value, type, CultureInfo.InvariantCulture); }
                catch (OverflowException) { throw Bad(path, "a number that fits " + type.Name); }
            }
            var list = value as List<object>;
            if (type.IsArray)
            {
                if (list == null) throw Bad(path, "an array");
                Array array = Array.CreateInstance(type.GetElementType(), list.Count);
                for (int i = 0; i < list.Count; i++) array.SetValue(Convert(list[i], type.GetElementType(), path + "[" + i + "]"), i);
                return array;
            }
            if (type.IsGenericType && type.GetGenericTypeDefinition() == typeof(List<>))
            {
                if (list == null) throw Bad(path, "an array");
                var result = (IList)Activator.CreateInstance(type);
                Type item = type.GetGenericArguments()[0];
                for (int i = 0; i < list.Count; i++) result.Add(Convert(list[i], item, path + "[" + i + "]"));
                return result;
            }
            var map = value as Dictionary<string, object>;
            if (map == null) throw Bad(path, "an object");
            object target = Activator.CreateInstance(type);
            foreach (FieldInfo field in type.GetFields(BindingFlags.Public | BindingFlags.Instance))
            {
                object item;
                if (map.TryGetValue(field.Name, out item)) field.SetValue(target, Convert(item, field.FieldType, path + "." + field.Name));
            }
            return target;
        }

        private static FormatException Bad(string path, string expected)
        {
            return new FormatException("JSON value at " + path + " is not " + expected);
        }
    }
}
