// Layer: core/protocol. HMAC-SHA256 message signatures (lowercase hex over header || content).
using System;
using System.Security.Cryptography;
using System.Text;

namespace Igi.Protocol
{
    /// <summary>Signs and verifies messages with the per-launch key from the connection file.</summary>
    public sealed class Signer
    {
        private readonly byte[] _key;

        /// <summary>Creates a signer from the raw key bytes (an empty key is refused).</summary>
        public Signer(byte[] key)
        {
            if (key == null || key.Length == 0) throw new ArgumentException("the HMAC key must not be empty");
            _key = (byte[])key.Clone();
        }

        /// <summary>Creates a signer from the connection file's hex key.</summary>
        public static Signer FromHex(string hexKey)
        {
            return new Signer(Hex.Decode(hexKey));
        }

        /// <summary>The signature frame: lowercase hex HMAC-SHA256 of header || content, as 64 ASCII bytes.</summary>
        public byte[] Sign(byte[] header, byte[] content)
        {
            using (var hmac = new HMACSHA256(_key))
            {
                hmac.TransformBlock(header, 0, header.Length, null, 0);
                hmac.TransformFinalBlock(content, 0, content.Length);
                return Encoding.ASCII.GetBytes(Hex.Encode(hmac.Hash));
            }
        }

        /// <summary>True when <paramref name="signature"/> is the right signature (constant-time comparison).</summary>
        public bool Verify(byte[] signature, byte[] header, byte[] content)
        {
            if (signature == null) return false;
            byte[] expected = Sign(header, content);
            if (signature.Length != expected.Length) return false;
            int diff = 0;
            for (int i = 0; i < expected.Length; i++) diff |= expected[i] ^ signature[i];
            return diff == 0;
        }
    }

    /// <summary>Lowercase hex helpers.</summary>
    public static class Hex
    {
        /// <summary>Lowercase hex of the bytes.</summary>
        public static string Encode(byte[] data)
        {
            var sb = new StringBuilder(data.Length * 2);
            foreach (byte b in data) sb.Append(b.ToString("x2"));
            return sb.ToString();
        }

        /// <summary>Bytes of a hex string (either case).</summary>
        /// <exception cref="FormatException">Odd length or a non-hex character.</exception>
        public static byte[] Decode(string hex)
        {
            if (hex == null || hex.Length % 2 != 0) throw new FormatException("hex string must have an even length");
            var result = new byte[hex.Length / 2];
            for (int i = 0; i < result.Length; i++)
                result[i] = (byte)((Nibble(hex[2 * i]) << 4) | Nibble(hex[2 * i + 1]));
            return result;
        }

        private static int Nibble(char c)
        {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            throw new FormatException("not a hex digit: '" + c + "'");
        }
    }
}
