// Layer: core/msgpack. Typed decode errors and the decoder's limits.
namespace Igi.MsgPack
{
    /// <summary>Why a msgpack buffer was refused.</summary>
    public enum MsgPackErrorKind
    {
        /// <summary>The buffer ends in the middle of a value.</summary>
        Truncated,
        /// <summary>A byte sequence msgpack does not define, or one this codec does not accept (ext, 0xc1).</summary>
        Malformed,
        /// <summary>Nesting deeper than <see cref="MsgPackLimits.MaxDepth"/>.</summary>
        TooDeep,
        /// <summary>A buffer or container larger than the limits allow.</summary>
        TooLarge,
        /// <summary>Bytes left over after the top-level value.</summary>
        TrailingBytes,
        /// <summary>A str whose bytes are not valid UTF-8.</summary>
        InvalidUtf8,
        /// <summary>A map with the same key twice.</summary>
        DuplicateKey,
        /// <summary>A map key that is not a str (the protocol allows only str keys).</summary>
        NonStringKey,
    }

    /// <summary>A msgpack buffer that cannot be decoded.</summary>
    public sealed class MsgPackException : IgiProtocolException
    {
        /// <summary>The class of failure.</summary>
        public MsgPackErrorKind Kind { get; private set; }

        /// <summary>Byte offset in the buffer where the failure was detected.</summary>
        public int Offset { get; private set; }

        /// <summary>Creates the exception.</summary>
        public MsgPackException(MsgPackErrorKind kind, int offset, string message)
            : base("msgpack " + kind + " at byte " + offset + ": " + message,
                   kind == MsgPackErrorKind.TooLarge ? "too_large" : "invalid_request")
        {
            Kind = kind;
            Offset = offset;
        }
    }

    /// <summary>Bounds the decoder enforces on untrusted input.</summary>
    public sealed class MsgPackLimits
    {
        /// <summary>Deepest nesting of arrays/maps accepted (the top-level value is depth 1).</summary>
        public int MaxDepth = 32;

        /// <summary>Largest buffer accepted, in bytes.</summary>
        public int MaxInputBytes = 64 * 1024 * 1024;

        /// <summary>Most elements (array items or map entries) one container may declare.</summary>
        public int MaxContainerLength = 1 << 20;

        /// <summary>Refuse maps that repeat a key.</summary>
        public bool RejectDuplicateKeys = true;

        /// <summary>The defaults: depth 32, 64 MiB, 1 Mi elements, duplicate keys refused.</summary>
        public static readonly MsgPackLimits Default = new MsgPackLimits();
    }
}
