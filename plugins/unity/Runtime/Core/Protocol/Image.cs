// Layer: core/protocol. The image a generate_request may carry (protocol 1.1), and pixel helpers without UnityEngine.
using System;

namespace Igi.Protocol
{
    /// <summary>
    /// An image attached to a player's line (protocol 1.1): PNG or JPEG bytes, or raw RGB8/RGBA8 pixels
    /// (row-major, top row first) with their width and height. The daemon checks the bytes against the format
    /// and the size limits (4096 px per side, 4096 x 2304 pixels) before decoding; the whole message must fit the
    /// daemon's max_frame_bytes (1 MiB by default), so send JPEG or downscale large frames.
    /// </summary>
    public sealed class Image : IWireObject
    {
        /// <summary>Longest side accepted by the daemon, pixels.</summary>
        public const int MaxSidePx = 4096;
        /// <summary>Most pixels accepted by the daemon.</summary>
        public const long MaxPixels = 4096L * 2304L;

        /// <summary>"png", "jpeg", "rgb8" or "rgba8".</summary>
        public string Format = "png";
        /// <summary>The file's bytes, or the raw pixels.</summary>
        public byte[] Data = new byte[0];
        /// <summary>Pixels; required for raw formats (null for PNG/JPEG: read from the header).</summary>
        public long? Width;
        /// <summary>Pixels; required for raw formats.</summary>
        public long? Height;

        /// <summary>An encoded PNG.</summary>
        public static Image Png(byte[] data) { return new Image { Format = "png", Data = Check(data) }; }

        /// <summary>An encoded JPEG.</summary>
        public static Image Jpeg(byte[] data) { return new Image { Format = "jpeg", Data = Check(data) }; }

        /// <summary>Raw pixels, top row first: 3 (rgb8) or 4 (rgba8) bytes per pixel.</summary>
        public static Image Raw(byte[] pixels, int width, int height, bool alpha)
        {
            int channels = alpha ? 4 : 3;
            if (width < 1 || height < 1) throw new ArgumentException("width and height must be >= 1");
            if (Check(pixels).LongLength != (long)width * height * channels)
                throw new ArgumentException("pixels hold " + pixels.LongLength + " bytes, not " + width + "x" + height + "x" + channels);
            return new Image { Format = alpha ? "rgba8" : "rgb8", Data = pixels, Width = width, Height = height };
        }

        private static byte[] Check(byte[] data)
        {
            if (data == null || data.Length == 0) throw new ArgumentException("image data is empty");
            return data;
        }

        /// <inheritdoc/>
        public void Write(Igi.MsgPack.MsgPackWriter w)
        {
            new FieldWriter(w, 4).Str("format", Format).Bin("data", Data).Int("width", Width).Int("height", Height);
        }

        /// <summary>Reads the object.</summary>
        public static Image Read(FieldReader r)
        {
            string format = r.Str("format");
            if (format != "png" && format != "jpeg" && format != "rgb8" && format != "rgba8")
                throw new IgiProtocolException("invalid image: field 'format' must be png, jpeg, rgb8 or rgba8, got '" + format + "'");
            return new Image
            {
                Format = format,
                Data = r.Bin("data", minLength: 1),
                Width = r.Int("width", false, true, min: 1, max: int.MaxValue),
                Height = r.Int("height", false, true, min: 1, max: int.MaxValue),
            };
        }
    }

    /// <summary>Pixel buffer helpers for captures (no UnityEngine: tested in the console tests).</summary>
    public static class ImagePixels
    {
        /// <summary>
        /// The rows of <paramref name="pixels"/> in reverse order (Unity's textures are bottom row first, the
        /// protocol's raw images top row first). <paramref name="channels"/> bytes per pixel.
        /// </summary>
        public static byte[] FlipRows(byte[] pixels, int width, int height, int channels)
        {
            int stride = width * channels;
            if (pixels == null || pixels.Length != stride * height)
                throw new ArgumentException("pixels do not hold " + width + "x" + height + "x" + channels + " bytes");
            var flipped = new byte[pixels.Length];
            for (int y = 0; y < height; y++)
                Buffer.BlockCopy(pixels, (height - 1 - y) * stride, flipped, y * stride, stride);
            return flipped;
        }

        /// <summary>RGBA8 to RGB8 (alpha dropped): a quarter fewer bytes on the wire.</summary>
        public static byte[] DropAlpha(byte[] rgba)
        {
            if (rgba == null || rgba.Length % 4 != 0) throw new ArgumentException("RGBA8 data must be a multiple of 4 bytes");
            var rgb = new byte[rgba.Length / 4 * 3];
            for (int i = 0, j = 0; i < rgba.Length; i += 4, j += 3)
            {
                rgb[j] = rgba[i]; rgb[j + 1] = rgba[i + 1]; rgb[j + 2] = rgba[i + 2];
            }
            return rgb;
        }
    }
}
