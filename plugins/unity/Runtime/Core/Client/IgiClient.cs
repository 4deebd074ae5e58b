// Layer: core/client. The game-facing client: handshake, sessions, streaming generation, budgets, status.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Igi.Protocol;
using Igi.Transport;

namespace Igi.Client
{
    /// <summary>
    /// Client of the IGI daemon over one DEALER socket.
    /// <para>Threading: a background I/O thread owns the socket, sends queued requests, receives replies,
    /// sends heartbeats and enforces timeouts. Task results complete on thread-pool threads (an <c>await</c>
    /// in Unity resumes on the main thread). Streaming callbacks (onToken/onDone/onError) and other
    /// game-facing callbacks are queued and run only inside <see cref="Pump"/>, which the game calls on its
    /// main thread every frame (Unity: from Update).</para>
    /// <para>Frame limits (PROTOCOL.md sections 1.4 and 10): replies are decoded with the daemon's announced
    /// <c>hello_reply.limits.max_frame_bytes</c>, and the socket's <c>ZMQ_MAXMSGSIZE</c> hard cap is twice it. libzmq
    /// applies that option only to connections made after it is set, so when the announced limit needs another cap
    /// than the handshake socket has (a daemon configured away from the 1 MiB default), the client connects a fresh
    /// socket with the right cap and handshakes again on it. A daemon frame over the cap makes libzmq drop the
    /// connection for good (a protocol error is not reconnected): requests then fail at send, and the daemon is
    /// declared gone after client_timeout_s.</para>
    /// </summary>
    public sealed partial class IgiClient : IDisposable
    {
        private readonly ConnectionInfo _info;
        private readonly Signer _signer;
        private readonly IgiClientOptions _options;
        private readonly IIgiTransport _transport;
        private readonly long? _maxMessageBytes;
        private readonly CallbackQueue _callbacks = new CallbackQueue();
        private readonly ConcurrentQueue<byte[][]> _outbox = new ConcurrentQueue<byte[][]>();
        private readonly Dictionary<string, Pending> _pending = new Dictionary<string, Pending>(StringComparer.Ordinal);
        private readonly object _lock = new object();
        private readonly Stopwatch _clock = Stopwatch.StartNew();
        private readonly Thread _io;
        private volatile bool _stopping;
        private volatile bool _daemonAlive = true;
        private long _droppedMessages;

        /// <summary>
        /// Handshakes per ConnectAsync at most: the first, one on a socket with the announced cap, and one more should the
        /// daemon announce yet another limit in between (e.g. it restarted); that last one is kept whatever it announces.
        /// </summary>
        private const int MaxHandshakes = 3;

        /// <summary>Reads of a connection file whose daemon is gone per ConnectAsync(path) at most: one rewritten between two
        /// reads is read again, twice at most (a daemon starting at the same path replaces it once).</summary>
        private const int MaxStaleReads = 3;

        private IgiClient(ConnectionInfo info, IgiClientOptions options, long maxMessageBytes)
        {
            _info = info;
            _options = options ?? new IgiClientOptions();
            _signer = Signer.FromHex(info.KeyHex);
            _transport = _options.TransportFactory();
            try
            {
                var capped = _transport as IIgiMessageSizeCap;
                if (capped != null)
                {
                    capped.MaxMessageBytes = maxMessageBytes;  // before Connect: libzmq applies it to later connections only
                    _maxMessageBytes = maxMessageBytes;
                }
                if (info.PlainPassword != null)  // PROTOCOL.md 1.5: the daemon lets in only peers with its PLAIN credential
                {
                    var credential = _transport as IIgiHandshakeCredential;
                    if (credential == null)
                        throw new IgiTransportException("the daemon authenticates at the ZeroMQ handshake (zmq_mechanism \"plain\") " +
                                                        "and this transport cannot present a credential (IIgiHandshakeCredential)");
                    credential.SetPlainCredential(info.PlainUsername, info.PlainPassword);
                }
                _transport.Connect(info.Endpoint);
            }
            catch
            {
                _transport.Dispose();
                throw;
            }
            _io = new Thread(IoLoop) { IsBackground = true, Name = "IgiClient I/O" };
            _io.Start();
        }

        /// <summary>Connects with the daemon's connection file and completes the handshake (blocking; each handshake is bounded by
        /// HelloTimeoutS, and there are two when the announced max_frame_bytes needs another socket cap, at most three).
        /// A file that names a daemon that is gone gets a handshake of at most StaleHelloTimeoutS instead (see
        /// <see cref="ConnectAsync(string, IgiClientOptions)"/>).</summary>
        /// <exception cref="IgiStaleConnectionFileException">The file names a daemon that is gone (killed without removing it).</exception>
        /// <exception cref="IgiConnectionFileException">The file is missing or invalid.</exception>
        /// <exception cref="IgiTransportException">libzmq is missing or the endpoint is refused.</exception>
        /// <exception cref="IgiTimeoutException">No hello_reply in time (daemon not running?).</exception>
        /// <exception cref="IgiRemoteException">The daemon refused the handshake (e.g. unsupported_version).</exception>
        public static IgiClient Connect(string connectionFile, IgiClientOptions options = null)
        {
            return Wait(ConnectAsync(connectionFile, options));
        }

        /// <summary>Connects to a parsed connection file and completes the handshake (blocking).</summary>
        public static IgiClient Connect(ConnectionInfo info, IgiClientOptions options = null)
        {
            return Wait(ConnectAsync(info, options));
        }

        /// <summary>
        /// Connects and completes the handshake without blocking the caller. A file whose daemon is gone (its pid does not
        /// run, or runs with another start time than <c>pid_start_ticks</c>: a daemon killed with SIGKILL left it; see
        /// <see cref="ProcessLiveness"/>) gets one handshake of at most <see cref="IgiClientOptions.StaleHelloTimeoutS"/>
        /// (the pid may be of another pid namespace: a daemon that answers is used), then
        /// <see cref="IgiStaleConnectionFileException"/> instead of an <see cref="IgiTimeoutException"/> after
        /// HelloTimeoutS. A file rewritten meanwhile (a daemon starting at the same path) is read again.
        /// </summary>
        public static Task<IgiClient> ConnectAsync(string connectionFile, IgiClientOptions options = null)
        {
            return ConnectAsync(connectionFile, ConnectionInfo.Load(connectionFile), options ?? new IgiClientOptions());
        }

        private static async Task<IgiClient> ConnectAsync(string connectionFile, ConnectionInfo info, IgiClientOptions options)
        {
            for (int reads = 1; ; reads++)
            {
                if (ProcessLiveness.IsRunning(info.Pid, info.PidStartTicks) != false)
                    return await ConnectAsync(info, options).ConfigureAwait(false);
                try
                {
                    return await ConnectAsync(info, options, Math.Min(options.HelloTimeoutS, options.StaleHelloTimeoutS)).ConfigureAwait(false);
                }
                catch (IgiTimeoutException) { }
                ConnectionInfo now = ConnectionInfo.Load(connectionFile);  // gone meanwhile: missing, as at the start
                if (reads >= MaxStaleReads || (now.Pid == info.Pid && now.KeyHex == info.KeyHex))
                    throw new IgiStaleConnectionFileException(
                        "connection file '" + connectionFile + "' names daemon pid " + info.Pid + ", which is no longer running " +
                        "(a daemon killed without removing its file); start the daemon, which replaces it", connectionFile, info.Pid);
                info = now;
            }
        }

        /// <summary>
        /// Connects to a parsed connection file and completes the handshake. The first handshake runs on a socket capped
        /// at 2 x the default <c>max_frame_bytes</c>; when <c>hello_reply.limits.max_frame_bytes</c> asks for another cap,
        /// that socket is closed and the handshake is repeated on a fresh one connected with <c>2 * max_frame_bytes</c>.
        /// </summary>
        public static Task<IgiClient> ConnectAsync(ConnectionInfo info, IgiClientOptions options = null)
        {
            return ConnectAsync(info, options, null);
        }

        private static async Task<IgiClient> ConnectAsync(ConnectionInfo info, IgiClientOptions options, double? helloTimeoutS)
        {
            long cap = MaxMessageBytesFor(WireCodec.DefaultMaxFrameBytes);
            for (int handshake = 1; ; handshake++)
            {
                var client = new IgiClient(info, options, cap);
                HelloReply reply;
                try
                {
                    reply = await client.HandshakeAsync(helloTimeoutS ?? client._options.HelloTimeoutS).ConfigureAwait(false);
                }
                catch
                {
                    client.Dispose();
                    throw;
                }
                long wanted = MaxMessageBytesFor(reply.Limits.MaxFrameBytes);
                // A transport without a cap cannot take another one; after MaxHandshakes the daemon changed its limit at
                // every handshake (restarts), and the last socket is kept (its decoder still applies the announced limit).
                if (client._maxMessageBytes == null || wanted == cap || handshake >= MaxHandshakes)
                {
                    client.OnHello(reply);
                    return client;
                }
                client.Log("hello_reply announced max_frame_bytes " + reply.Limits.MaxFrameBytes + ": reconnecting with ZMQ_MAXMSGSIZE " + wanted);
                client.Dispose();
                cap = wanted;
            }
        }

        /// <summary>The <c>ZMQ_MAXMSGSIZE</c> hard cap for a <c>max_frame_bytes</c> limit: twice it (PROTOCOL.md 1.4); -1 (none) past the int64 range.</summary>
        public static long MaxMessageBytesFor(long maxFrameBytes)
        {
            return maxFrameBytes > long.MaxValue / 2 ? -1 : 2 * maxFrameBytes;
        }

        private async Task<HelloReply> HandshakeAsync(double timeoutS)
        {
            var hello = new HelloRequest
            {
                ClientName = _options.ClientName,
                Capabilities = new List<string>(_options.Capabilities ?? new string[0]),
            };
            var reply = (HelloReply)await SendAsync(hello, null, timeoutS).ConfigureAwait(false);
            int major;
            if (!int.TryParse(reply.ProtocolVersion.Split('.')[0], out major) || major != IgiVersion.ProtocolMajor)
                throw new IgiProtocolException("daemon speaks protocol " + reply.ProtocolVersion + ", this plugin " + IgiVersion.Protocol,
                                               ErrorCodes.UnsupportedVersion);
            return reply;
        }

        /// <summary>The daemon's hello_reply (versions, heartbeat rules, limits, loaded model).</summary>
        public HelloReply Hello { get; private set; }

        /// <summary>
        /// The socket's inbound frame cap (<c>ZMQ_MAXMSGSIZE</c>) this client connected with: 2 x the announced
        /// <c>limits.max_frame_bytes</c> (-1 = none); null when the transport has no cap (not an <see cref="IIgiMessageSizeCap"/>).
        /// </summary>
        public long? MaxMessageBytes { get { return _maxMessageBytes; } }

        /// <summary>The connection file contents used.</summary>
        public ConnectionInfo Connection { get { return _info; } }

        /// <summary>False once the daemon stayed silent past client_timeout_s with a heartbeat outstanding, or the client closed.</summary>
        public bool IsDaemonAlive { get { return _daemonAlive && !_stopping; } }

        /// <summary>
        /// Received messages dropped: invalid ones (bad frame, bad signature, oversized, undecodable, unknown type) and
        /// error_replies flagged <c>detail.duplicate_msg_id</c>, which never end the request they name (PROTOCOL.md 6.6).
        /// </summary>
        public long DroppedMessages { get { return Interlocked.Read(ref _droppedMessages); } }

        /// <summary>Requests awaiting their terminal reply (heartbeats included).</summary>
        public int PendingRequests { get { lock (_lock) return _pending.Count; } }

        /// <summary>Main-thread callbacks waiting for <see cref="Pump"/>.</summary>
        public int QueuedCallbacks { get { return _callbacks.Count; } }

        /// <summary>Raised inside <see cref="Pump"/> when a game callback throws (otherwise the exception propagates out of Pump).</summary>
        public event Action<Exception> CallbackFailed
        {
            add { _callbacks.CallbackFailed += value; }
            remove { _callbacks.CallbackFailed -= value; }
        }

        /// <summary>Runs queued callbacks on the calling thread (the game's main thread). Call once per frame.</summary>
        /// <param name="maxCallbacks">Most callbacks to run now (e.g. the throttle's tokens_per_frame).</param>
        /// <returns>The number of callbacks run.</returns>
        public int Pump(int maxCallbacks = int.MaxValue) { return _callbacks.Pump(maxCallbacks); }

        /// <summary>Queues a callback for the next <see cref="Pump"/>. Thread-safe.</summary>
        public void Post(Action callback) { _callbacks.Post(callback); }

        /// <summary>Opens an NPC session; returns its session id.</summary>
        public async Task<string> CreateSessionAsync(string persona, string systemPrompt, Sampling sampling = null, int priority = 0)
        {
            var request = new CreateSessionRequest { Persona = persona ?? "", SystemPrompt = systemPrompt ?? "", Sampling = sampling ?? new Sampling(), Priority = priority };
            var reply = (CreateSessionReply)await SendAsync(request, null, _options.RequestTimeoutS).ConfigureAwait(false);
            return reply.SessionId;
        }

        /// <summary>Opens an NPC session from a full request (protocol 1.1: Grammar, JsonSchema, Tools); returns its id.</summary>
        /// <exception cref="IgiInvalidGrammarException">The daemon refused the grammar.</exception>
        /// <exception cref="IgiInvalidSchemaException">The daemon refused the schema or a tool's parameters.</exception>
        public async Task<string> CreateSessionAsync(CreateSessionRequest request)
        {
            if (request == null) throw new ArgumentNullException("request");
            var reply = (CreateSessionReply)await SendAsync(request, null, _options.RequestTimeoutS).ConfigureAwait(false);
            return reply.SessionId;
        }

        /// <summary>Closes an NPC session and frees its KV state on the daemon.</summary>
        public Task CloseSessionAsync(string sessionId)
        {
            return SendAsync(new CloseSessionRequest(), RequireSession(sessionId), _options.RequestTimeoutS);
        }

        /// <summary>
        /// Streams one player line through an NPC session. Callbacks run inside <see cref="Pump"/>:
        /// <paramref name="onToken"/> per token_event, then exactly one of <paramref name="onDone"/> (generate_reply, including
        /// finish_reason "cancelled") or <paramref name="onError"/> (error_reply, timeout, daemon gone, client closed).
        /// </summary>
        /// <param name="sessionId">From <see cref="CreateSessionAsync(string, string, Sampling, int)"/>.</param>
        /// <param name="text">The player's line.</param>
        /// <param name="onToken">Per token; may be null.</param>
        /// <param name="onDone">The terminal reply; may be null.</param>
        /// <param name="onError">The failure; may be null.</param>
        /// <param name="sampling">null = the session's sampling.</param>
        /// <param name="maxTokens">null = the sampling's max_tokens.</param>
        /// <param name="priority">-100..100; null = the session's priority.</param>
        /// <param name="image">1.1: an image the NPC is shown with the line (<see cref="Image"/>); null = none.</param>
        /// <returns>The handle: msg id, text so far, <see cref="GenerateHandle.Cancel"/>, completion task.</returns>
        public GenerateHandle Generate(string sessionId, string text, Action<TokenEvent> onToken, Action<GenerateReply> onDone,
                                       Action<IgiException> onError, Sampling sampling = null, long? maxTokens = null, int? priority = null,
                                       Image image = null)
        {
            var request = new GenerateRequest { Text = text ?? "", Sampling = sampling, MaxTokens = maxTokens, Priority = priority,
                                                Image = image };
            return Generate(sessionId, request, onToken, onDone, onError);
        }

        /// <summary>
        /// Streams a full generate_request (protocol 1.1: Grammar, JsonSchema, ToolChoice, ToolResult); callbacks as in the
        /// other overload. A constrained reply's JSON is <see cref="GenerateReply.JsonOutput"/> (map it with
        /// <c>reply.Parsed&lt;T&gt;()</c>); a tool call ends it with FinishReason "tool_call" and <see cref="GenerateReply.ToolCall"/>.
        /// </summary>
        public GenerateHandle Generate(string sessionId, GenerateRequest request, Action<TokenEvent> onToken, Action<GenerateReply> onDone,
                                       Action<IgiException> onError)
        {
            if (request == null) throw new ArgumentNullException("request");
            var pending = new Pending
            {
                IdleTimeout = true,
                OnToken = onToken,
                OnDone = onDone,
                OnError = onError,
                Tcs = new TaskCompletionSource<IgiMessage>(TaskCreationOptions.RunContinuationsAsynchronously),
            };
            Task<GenerateReply> completion = pending.Tcs.Task.ContinueWith(
                t => (GenerateReply)t.GetAwaiter().GetResult(), CancellationToken.None,
                TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
            // The callbacks are the primary channel; observe the task so an ignored failure is not reported as unobserved.
            completion.ContinueWith(t => { var ignored = t.Exception; }, TaskContinuationOptions.OnlyOnFaulted);
            Header header = Header.New(request.Type, RequireSession(sessionId));
            pending.Handle = new GenerateHandle(this, header.MsgId, sessionId, completion);
            Enqueue(header, request, pending, _options.GenerateIdleTimeoutS);
            return pending.Handle;
        }

        /// <summary>Cancels a generation by its msg id (priority path).</summary>
        public async Task<CancelReply> CancelAsync(string generateMsgId)
        {
            return (CancelReply)await SendAsync(new CancelRequest { TargetMsgId = generateMsgId }, null, _options.RequestTimeoutS).ConfigureAwait(false);
        }

        /// <summary>Sets the VRAM budget the game allows the daemon (0 = CPU only).</summary>
        /// <param name="vramBudgetMib">VRAM the daemon may use, MiB.</param>
        /// <param name="reason">Free text for the daemon's log.</param>
        /// <param name="levelsMib">Protocol 1.3: the budget levels the game will ask for, MiB (at most
        /// <see cref="SetBudgetRequest.MaxLevels"/>; for example menu 6144, play 2048, cutscene 0). The daemon plans a
        /// placement for each ahead of time, so a later change to one of them needs no planning; they change nothing
        /// else. null = the levels declared before stay; empty = clear them. A daemon older than 1.3 ignores them.</param>
        /// <returns>The ack; <see cref="BudgetAck.IsInterim"/> (1.3) says the placement in force is one planned ahead
        /// that fits the budget, and the daemon's exact plan follows in the background without another reply.</returns>
        /// <exception cref="IgiProtocolException">invalid_request, unsent: a negative level or too many levels.</exception>
        public async Task<BudgetAck> SetBudgetAsync(long vramBudgetMib, string reason = "", IList<long> levelsMib = null)
        {
            var request = new SetBudgetRequest { VramBudgetMib = vramBudgetMib, Reason = reason ?? "", LevelsMib = CheckLevels(levelsMib) };
            return (BudgetAck)await SendAsync(request, null, _options.RequestTimeoutS * 10).ConfigureAwait(false);
        }

        // Levels the daemon would refuse (invalid_request) are refused here, unsent, with the same code.
        private static List<long> CheckLevels(IList<long> levelsMib)
        {
            if (levelsMib == null) return null;
            if (levelsMib.Count > SetBudgetRequest.MaxLevels)
                throw new IgiProtocolException("levels_mib has more than " + SetBudgetRequest.MaxLevels + " items", "invalid_request");
            foreach (long level in levelsMib)
                if (level < 0) throw new IgiProtocolException("levels_mib item " + level + " is negative", "invalid_request");
            return new List<long>(levelsMib);
        }

        /// <summary>Urgently shrinks the daemon's VRAM use to <paramref name="vramBudgetMib"/> (priority path).</summary>
        public async Task<BudgetAck> ReclaimAsync(long vramBudgetMib, double deadlineS)
        {
            var request = new ReclaimRequest { VramBudgetMib = vramBudgetMib, DeadlineS = deadlineS };
            return (BudgetAck)await SendAsync(request, null, Math.Max(_options.RequestTimeoutS, deadlineS * 4)).ConfigureAwait(false);
        }

        /// <summary>Reports the game's frame timing; the reply carries the pacing the daemon applies.</summary>
        public async Task<FrameStatsReply> SendFrameStatsAsync(double frameTimeMs, double targetFrameTimeMs, double? freeVramMib = null, double? gpuBusyPct = null)
        {
            var request = new FrameStatsRequest { FrameTimeMs = frameTimeMs, TargetFrameTimeMs = targetFrameTimeMs, FreeVramMib = freeVramMib, GpuBusyPct = gpuBusyPct };
            return (FrameStatsReply)await SendAsync(request, null, _options.RequestTimeoutS).ConfigureAwait(false);
        }

        /// <summary>Asks for the daemon's state.</summary>
        public async Task<StatusReply> StatusAsync()
        {
            return (StatusReply)await SendAsync(new StatusRequest(), null, _options.RequestTimeoutS).ConfigureAwait(false);
        }

        /// <summary>Loads (or replaces) the model; null path = the embedded default model. <paramref name="mmprojPath"/>
        /// (protocol 1.1) is a vision projector beside it (null = none: the NPCs cannot be shown images).</summary>
        public async Task<LoadModelReply> LoadModelAsync(string modelPath = null, long nCtx = 2048, long? vramBudgetMib = null, string mmprojPath = null)
        {
            var request = new LoadModelRequest { ModelPath = modelPath, NCtx = nCtx, VramBudgetMib = vramBudgetMib, MmprojPath = mmprojPath };
            return (LoadModelReply)await SendAsync(request, null, _options.RequestTimeoutS * 10).ConfigureAwait(false);
        }

        /// <summary>
        /// Sends any request and returns its successful terminal reply; an error_reply faults the task with the
        /// typed <see cref="IgiRemoteException"/> of its code (see <see cref="ErrorCodes.ExceptionFactories"/>).
        /// </summary>
        /// <param name="request">The request.</param>
        /// <param name="sessionId">header.session_id (required by session requests).</param>
        /// <param name="timeoutS">Terminal-reply timeout, s.</param>
        public Task<IgiMessage> SendAsync(IgiRequest request, string sessionId, double timeoutS)
        {
            if (sessionId != null) RequireSession(sessionId);
            var pending = new Pending { Tcs = new TaskCompletionSource<IgiMessage>(TaskCreationOptions.RunContinuationsAsynchronously) };
            Enqueue(Header.New(request.Type, sessionId), request, pending, timeoutS);
            return pending.Tcs.Task;
        }

        /// <summary>Waits for a task and rethrows its own exception (not an AggregateException).</summary>
        public static T Wait<T>(Task<T> task) { return task.GetAwaiter().GetResult(); }

        /// <summary>Waits for a task and rethrows its own exception (not an AggregateException).</summary>
        public static void Wait(Task task) { task.GetAwaiter().GetResult(); }

        // A session id the daemon cannot parse makes a header it cannot answer by msg_id: the request would only
        // time out. Refused here with the code the daemon would give.
        private static string RequireSession(string sessionId)
        {
            if (string.IsNullOrEmpty(sessionId))
                throw new IgiProtocolException("a session id is required (CreateSessionAsync)", "invalid_request");
            if (!Protocol.FieldReader.IsSessionId(sessionId))
                throw new IgiProtocolException("session id '" + sessionId + "' is not 1-64 characters of A-Z a-z 0-9 _ -", "invalid_request");
            return sessionId;
        }

        /// <summary>Stops the I/O thread, closes the socket (linger 0) and fails requests still in flight with <see cref="IgiClientClosedException"/>.</summary>
        public void Dispose()
        {
            if (_stopping) return;
            _stopping = true;
            _transport.Wake();
            if (Thread.CurrentThread != _io) _io.Join(5000);
            FailAll(() => new IgiClientClosedException("the client was closed with the request in flight"));
        }
    }
}
