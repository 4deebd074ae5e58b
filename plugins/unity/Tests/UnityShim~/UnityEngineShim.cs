// COMPILE-ONLY shim of the few UnityEngine types Runtime/Unity uses, so build.sh can type-check those
// MonoBehaviours with -define:UNITY_5_3_OR_NEWER on a machine without Unity. Never executed, never shipped:
// it is compiled into build/Igi.Unity.ShimCheck.dll only. In a Unity project the real UnityEngine is used.
#pragma warning disable 1591
using System;

namespace UnityEngine
{
    public class Object { public static void Destroy(Object obj) { } }
    public class Component : Object { }
    public class Behaviour : Component { }
    public class MonoBehaviour : Behaviour { public T GetComponent<T>() { return default(T); } }
    public sealed class Camera : Behaviour
    {
        public RenderTexture targetTexture { get { return null; } set { } }
        public int pixelWidth { get { return 0; } }
        public int pixelHeight { get { return 0; } }
        public void Render() { }
    }

    public enum TextureFormat { RGBA32 = 4 }
    public struct Rect { public Rect(float x, float y, float width, float height) { } }
    public struct Color32 { public byte r, g, b, a; }

    public class Texture : Object
    {
        public virtual int width { get { return 0; } }
        public virtual int height { get { return 0; } }
    }

    public class Texture2D : Texture
    {
        public Texture2D(int width, int height, TextureFormat format, bool mipChain) { }
        public bool isReadable { get { return true; } }
        public Color32[] GetPixels32() { return new Color32[0]; }
        public void ReadPixels(Rect source, int destX, int destY) { }
        public void Apply() { }
    }

    public class RenderTexture : Texture
    {
        public static RenderTexture active { get { return null; } set { } }
        public static RenderTexture GetTemporary(int width, int height, int depthBuffer) { return null; }
        public static void ReleaseTemporary(RenderTexture temp) { }
    }

    public static class Graphics { public static void Blit(Texture source, RenderTexture dest) { } }

    public static class ImageConversion
    {
        public static byte[] EncodeToPNG(Texture2D tex) { return new byte[0]; }
        public static byte[] EncodeToJPG(Texture2D tex, int quality) { return new byte[0]; }
    }

    public static class Debug
    {
        public static void Log(object message) { }
        public static void Log(object message, Object context) { }
        public static void LogWarning(object message) { }
        public static void LogWarning(object message, Object context) { }
        public static void LogError(object message, Object context) { }
        public static void LogException(Exception exception, Object context) { }
    }

    public static class Time
    {
        public static float unscaledDeltaTime { get { return 0f; } }
        public static float realtimeSinceStartup { get { return 0f; } }
    }

    public static class Application
    {
        public static string persistentDataPath { get { return ""; } }
        public static string productName { get { return ""; } }
        public static string streamingAssetsPath { get { return ""; } }
    }

    public enum KeyCode { K, S, T }
    public static class Input { public static bool GetKeyDown(KeyCode key) { return false; } }

    public struct FrameTiming { public double cpuMainThreadFrameTime, cpuRenderThreadFrameTime, gpuFrameTime; }
    public static class FrameTimingManager
    {
        public static bool IsFeatureEnabled() { return false; }
        public static void CaptureFrameTimings() { }
        public static uint GetLatestTimings(uint numFrames, FrameTiming[] timings) { return 0; }
    }
    public static class Mathf { public static float Max(float a, float b) { return a > b ? a : b; } }

    [AttributeUsage(AttributeTargets.Field)] public sealed class TooltipAttribute : Attribute { public TooltipAttribute(string tooltip) { } }
    [AttributeUsage(AttributeTargets.Field)] public sealed class TextAreaAttribute : Attribute { public TextAreaAttribute(int minLines, int maxLines) { } }
    [AttributeUsage(AttributeTargets.Field)] public sealed class RangeAttribute : Attribute { public RangeAttribute(float min, float max) { } }
    [AttributeUsage(AttributeTargets.Field)] public sealed class SerializeField : Attribute { }
    [AttributeUsage(AttributeTargets.Field)] public sealed class HideInInspector : Attribute { }
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

#if UNITY_EDITOR
namespace UnityEditor
{
    public static class AssemblyReloadEvents
    {
        public delegate void AssemblyReloadCallback();
        public static event AssemblyReloadCallback beforeAssemblyReload { add { } remove { } }
    }
}
#endif
