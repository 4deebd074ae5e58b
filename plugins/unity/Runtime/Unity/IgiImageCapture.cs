// Layer: Unity adapter. What the player sees, as an Image for generate_request (protocol 1.1): from a Texture2D,
// a RenderTexture or a Camera.
#if UNITY_5_3_OR_NEWER
using System;
using Igi.Protocol;
using UnityEngine;

namespace Igi.Unity
{
    /// <summary>How a capture goes on the wire.</summary>
    public enum IgiImageEncoding
    {
        /// <summary>JPEG (smallest; a 1280x720 frame is about 100-200 KB at quality 75).</summary>
        Jpeg,
        /// <summary>PNG (lossless; larger).</summary>
        Png,
        /// <summary>Raw RGB8 pixels (no encode cost on the main thread; 3 bytes per pixel: downscale first).</summary>
        Rgb8,
    }

    /// <summary>
    /// Captures for NPCs that see. Call on the main thread (texture reads are main-thread only in Unity).
    /// <code>
    /// // "what this camera sees", downscaled to 640x360, as JPEG:
    /// Image frame = IgiImageCapture.FromCamera(Camera.main, 640, 360);
    /// npc.SayWithImage("What do you think of this place?", frame);
    /// </code>
    /// </summary>
    public static class IgiImageCapture
    {
        /// <summary>
        /// A readable Texture2D (Read/Write enabled in its import settings, or one created at run time).
        /// </summary>
        public static Image FromTexture2D(Texture2D texture, IgiImageEncoding encoding = IgiImageEncoding.Jpeg, int jpegQuality = 75)
        {
            if (texture == null) throw new ArgumentNullException("texture");
            if (!texture.isReadable) throw new ArgumentException("the texture is not readable: enable Read/Write in its import settings");
            switch (encoding)
            {
                case IgiImageEncoding.Png: return Image.Png(ImageConversion.EncodeToPNG(texture));
                case IgiImageEncoding.Rgb8:
                    int w = texture.width, h = texture.height;
                    Color32[] px = texture.GetPixels32();  // bottom row first
                    var rgb = new byte[px.Length * 3];
                    for (int i = 0; i < px.Length; i++) { rgb[3 * i] = px[i].r; rgb[3 * i + 1] = px[i].g; rgb[3 * i + 2] = px[i].b; }
                    return Image.Raw(ImagePixels.FlipRows(rgb, w, h, 3), w, h, false);
                default: return Image.Jpeg(ImageConversion.EncodeToJPG(texture, jpegQuality));
            }
        }

        /// <summary>
        /// A RenderTexture (a render target, a minimap, a security camera's feed), read back and optionally downscaled
        /// to <paramref name="width"/> x <paramref name="height"/> (0 = its own size).
        /// </summary>
        public static Image FromRenderTexture(RenderTexture source, int width = 0, int height = 0,
                                              IgiImageEncoding encoding = IgiImageEncoding.Jpeg, int jpegQuality = 75)
        {
            if (source == null) throw new ArgumentNullException("source");
            int w = width > 0 ? width : source.width, h = height > 0 ? height : source.height;
            RenderTexture scaled = null;
            RenderTexture read = source;
            if (w != source.width || h != source.height)
            {
                scaled = RenderTexture.GetTemporary(w, h, 0);
                Graphics.Blit(source, scaled);
                read = scaled;
            }
            RenderTexture previous = RenderTexture.active;
            var texture = new Texture2D(w, h, TextureFormat.RGBA32, false);
            try
            {
                RenderTexture.active = read;
                texture.ReadPixels(new Rect(0, 0, w, h), 0, 0);
                texture.Apply();
                return FromTexture2D(texture, encoding, jpegQuality);
            }
            finally
            {
                RenderTexture.active = previous;
                if (scaled != null) RenderTexture.ReleaseTemporary(scaled);
                UnityEngine.Object.Destroy(texture);
            }
        }

        /// <summary>"What this camera sees": renders <paramref name="camera"/> once into a temporary target.</summary>
        public static Image FromCamera(Camera camera, int width = 640, int height = 360,
                                       IgiImageEncoding encoding = IgiImageEncoding.Jpeg, int jpegQuality = 75)
        {
            if (camera == null) throw new ArgumentNullException("camera");
            RenderTexture target = RenderTexture.GetTemporary(width, height, 24);
            RenderTexture previous = camera.targetTexture;
            try
            {
                camera.targetTexture = target;
                camera.Render();
                return FromRenderTexture(target, 0, 0, encoding, jpegQuality);
            }
            finally
            {
                camera.targetTexture = previous;
                RenderTexture.ReleaseTemporary(target);
            }
        }
    }
}
#endif
