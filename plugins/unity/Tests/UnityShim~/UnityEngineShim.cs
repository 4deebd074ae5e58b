// COMPILE-ONLY shim of the few UnityEngine types Runtime/Unity uses, so build.sh can type-check those
// MonoBehaviours with -define:UNITY_5_3_OR_NEWER on a machine without Unity. Never executed, never shipped:
// it is compiled into build/Igi.Unity.ShimCheck.dll only. In a Unity project the real UnityEngine is used.
#pragma warning disable 1591
using System;

namespace UnityEngine
{
    public class Object { }
    public class Component : Object { }
    public class Behaviour : Component { }
    public class MonoBehaviour : Behaviour { public T GetComponent<T>() { return default(T); } }

    public static class Debug
    {
        public static void Log(object message) { }
        public static void Log(object message, Object context) { }
        public static void LogWarning(object message) { }
        public static void LogWarning(object message, Object context) { }
        public static void LogError(object message, Object context) { }
        public static void LogException(Exception exception, Object context) { }
    }

    public static class Time { public static float unscaledDeltaTime { get { return 0f; } } }

    public static class Application
    {
        public static string persistentDataPath { get { return ""; } }
        public static string productName { get { return ""; } }
        public static string streamingAssetsPath { get { return ""; } }
    }

    public enum KeyCode { K, S, T }
    public static class Input { public static bool GetKeyDown(KeyCode key) { return false; } }

    public static class Mathf { public static float Max(float a, float b) { return a > b ? a : b; } }

    [AttributeUsage(AttributeTargets.Field)] public sealed class TooltipAttribute : Attribute { public TooltipAttribute(string tooltip) { } }
    [AttributeUsage(AttributeTargets.Field)] public sealed class TextAreaAttribute : Attribute { public TextAreaAttribute(int minLines, int maxLines) { } }
    [AttributeUsage(AttributeTargets.Field)] public sealed class RangeAttribute : Attribute { public RangeAttribute(float min, float max) { } }
    [AttributeUsage(AttributeTargets.Class)] public sealed class DisallowMultipleComponent : Attribute { }
    [AttributeUsage(AttributeTargets.Class)] public sealed class RequireComponent : Attribute { public RequireComponent(Type a, Type b) { } }
    [AttributeUsage(AttributeTargets.Class)] public sealed class DefaultExecutionOrder : Attribute { public DefaultExecutionOrder(int order) { } }
}

namespace UnityEngine.Events
{
    public class UnityEvent { public void Invoke() { } public void AddListener(Action call) { } }
    public class UnityEvent<T0> { public void Invoke(T0 arg0) { } public void AddListener(Action<T0> call) { } }
    public class UnityEvent<T0, T1> { public void Invoke(T0 arg0, T1 arg1) { } public void AddListener(Action<T0, T1> call) { } }
}
