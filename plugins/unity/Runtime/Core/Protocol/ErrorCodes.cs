// Layer: core/protocol. The closed set of wire error codes and THE one mapping code -> exception type.
using System;
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>Stable error_reply.code strings of protocol 1.x.</summary>
    public static class ErrorCodes
    {
#pragma warning disable 1591 // the constant names are the wire strings (PROTOCOL.md section 8)
        public const string InvalidRequest = "invalid_request";
        public const string UnknownType = "unknown_type";
        public const string UnsupportedVersion = "unsupported_version";
        public const string TooLarge = "too_large";
        public const string Busy = "busy";
        public const string NotFound = "not_found";
        public const string NoModel = "no_model";
        public const string ModelNotFound = "model_not_found";
        public const string ModelInvalid = "model_invalid";
        public const string BudgetInfeasible = "budget_infeasible";
        public const string EngineFailure = "engine_failure";
        public const string Cancelled = "cancelled";
        public const string Timeout = "timeout";
        public const string ShuttingDown = "shutting_down";
        public const string Internal = "internal";
        // 1.1: constrained output and tools
        public const string InvalidGrammar = "invalid_grammar";
        public const string InvalidSchema = "invalid_schema";
        public const string UnknownTool = "unknown_tool";
        public const string InvalidToolArguments = "invalid_tool_arguments";
        public const string InvalidOutput = "invalid_output";
        // 1.1: images
        public const string InvalidImage = "invalid_image";
        // 1.2: the replay window (PROTOCOL.md 2.1)
        public const string Replayed = "replayed";
#pragma warning restore 1591

        /// <summary>The mapping table: every code and the exception it raises on the client.</summary>
        public static readonly IDictionary<string, Func<ErrorReply, IgiRemoteException>> ExceptionFactories =
            new Dictionary<string, Func<ErrorReply, IgiRemoteException>>(StringComparer.Ordinal)
            {
                { InvalidRequest, e => new IgiInvalidRequestException(e) },
                { UnknownType, e => new IgiUnknownTypeRemoteException(e) },
                { UnsupportedVersion, e => new IgiUnsupportedVersionException(e) },
                { TooLarge, e => new IgiTooLargeException(e) },
                { Busy, e => new IgiBusyException(e) },
                { NotFound, e => new IgiNotFoundException(e) },
                { NoModel, e => new IgiNoModelException(e) },
                { ModelNotFound, e => new IgiModelNotFoundException(e) },
                { ModelInvalid, e => new IgiModelInvalidException(e) },
                { BudgetInfeasible, e => new IgiBudgetInfeasibleException(e) },
                { EngineFailure, e => new IgiEngineFailureException(e) },
                { Cancelled, e => new IgiCancelledException(e) },
                { Timeout, e => new IgiRemoteTimeoutException(e) },
                { ShuttingDown, e => new IgiShuttingDownException(e) },
                { Internal, e => new IgiInternalException(e) },
                { InvalidGrammar, e => new IgiInvalidGrammarException(e) },
                { InvalidSchema, e => new IgiInvalidSchemaException(e) },
                { UnknownTool, e => new IgiUnknownToolException(e) },
                { InvalidToolArguments, e => new IgiInvalidToolArgumentsException(e) },
                { InvalidOutput, e => new IgiInvalidOutputException(e) },
                { InvalidImage, e => new IgiInvalidImageException(e) },
                { Replayed, e => new IgiReplayedException(e) },
            };

        /// <summary>The code if known; an unknown string from a newer minor version reads as <see cref="Internal"/>.</summary>
        public static string Parse(string code)
        {
            return code != null && ExceptionFactories.ContainsKey(code) ? code : Internal;
        }

        /// <summary>The typed exception for an error_reply.</summary>
        public static IgiRemoteException ToException(ErrorReply reply)
        {
            return ExceptionFactories[Parse(reply.Code)](reply);
        }
    }

    /// <summary>The daemon answered a request with error_reply.</summary>
    public class IgiRemoteException : IgiException
    {
        /// <summary>The wire code.</summary>
        public string Code { get; private set; }
        /// <summary>Structured detail, null = none.</summary>
        public MsgPackMap Detail { get; private set; }
        /// <summary>The same request may succeed if sent again later.</summary>
        public bool Retryable { get; private set; }

        /// <summary>Creates the exception from the reply.</summary>
        public IgiRemoteException(ErrorReply reply)
            : base(reply.Code + ": " + reply.Message + (reply.Detail != null ? " " + MsgPackValue.ToDebugString(reply.Detail) : ""))
        {
            Code = reply.Code;
            Detail = reply.Detail;
            Retryable = reply.Retryable;
        }
    }

#pragma warning disable 1591 // one line per code: the class name says it all
    public sealed class IgiInvalidRequestException : IgiRemoteException { public IgiInvalidRequestException(ErrorReply r) : base(r) { } }
    public sealed class IgiUnknownTypeRemoteException : IgiRemoteException { public IgiUnknownTypeRemoteException(ErrorReply r) : base(r) { } }
    public sealed class IgiUnsupportedVersionException : IgiRemoteException { public IgiUnsupportedVersionException(ErrorReply r) : base(r) { } }
    public sealed class IgiTooLargeException : IgiRemoteException { public IgiTooLargeException(ErrorReply r) : base(r) { } }
    public sealed class IgiBusyException : IgiRemoteException { public IgiBusyException(ErrorReply r) : base(r) { } }
    public sealed class IgiNotFoundException : IgiRemoteException { public IgiNotFoundException(ErrorReply r) : base(r) { } }
    public sealed class IgiNoModelException : IgiRemoteException { public IgiNoModelException(ErrorReply r) : base(r) { } }
    public sealed class IgiModelNotFoundException : IgiRemoteException { public IgiModelNotFoundException(ErrorReply r) : base(r) { } }
    public sealed class IgiModelInvalidException : IgiRemoteException { public IgiModelInvalidException(ErrorReply r) : base(r) { } }
    public sealed class IgiBudgetInfeasibleException : IgiRemoteException { public IgiBudgetInfeasibleException(ErrorReply r) : base(r) { } }
    public sealed class IgiEngineFailureException : IgiRemoteException { public IgiEngineFailureException(ErrorReply r) : base(r) { } }
    public sealed class IgiCancelledException : IgiRemoteException { public IgiCancelledException(ErrorReply r) : base(r) { } }
    public sealed class IgiRemoteTimeoutException : IgiRemoteException { public IgiRemoteTimeoutException(ErrorReply r) : base(r) { } }
    public sealed class IgiShuttingDownException : IgiRemoteException { public IgiShuttingDownException(ErrorReply r) : base(r) { } }
    public sealed class IgiInternalException : IgiRemoteException { public IgiInternalException(ErrorReply r) : base(r) { } }
    public sealed class IgiInvalidGrammarException : IgiRemoteException { public IgiInvalidGrammarException(ErrorReply r) : base(r) { } }
    public sealed class IgiInvalidSchemaException : IgiRemoteException { public IgiInvalidSchemaException(ErrorReply r) : base(r) { } }
    public sealed class IgiUnknownToolException : IgiRemoteException { public IgiUnknownToolException(ErrorReply r) : base(r) { } }
    public sealed class IgiInvalidToolArgumentsException : IgiRemoteException { public IgiInvalidToolArgumentsException(ErrorReply r) : base(r) { } }
    public sealed class IgiInvalidOutputException : IgiRemoteException { public IgiInvalidOutputException(ErrorReply r) : base(r) { } }
    public sealed class IgiInvalidImageException : IgiRemoteException { public IgiInvalidImageException(ErrorReply r) : base(r) { } }
    /// <summary>Protocol 1.2: the daemon refused a copy of a message it already executed, or one stamped outside its replay window.</summary>
    public sealed class IgiReplayedException : IgiRemoteException { public IgiReplayedException(ErrorReply r) : base(r) { } }
#pragma warning restore 1591
}
