// Layer: core/client. IgiClient's I/O thread: send queue, receive and dispatch, timeouts, heartbeats.
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Igi.Protocol;

namespace Igi.Client
{
    public sealed partial class IgiClient
    {
        private sealed class Pending
        {
            public string MsgId;
            public string RequestType;
            public string ReplyType;
            public double TimeoutS;
            public double DeadlineS;
            public bool IdleTimeout;
            public bool IsHeartbeat;
            public TaskCompletionSource<IgiMessage> Tcs;
            public GenerateHandle Handle;
            public Action<TokenEvent> OnToken;
            public Action<GenerateReply> OnDone;
            public Action<IgiException> OnError;
        }

        /// <summary>
        /// The shortest heartbeat period: a client sends heartbeat_request at most this often, and reads a smaller
        /// hello_reply.heartbeat_interval_s (0 included) as this value (PROTOCOL.md section 11).
        /// </summary>
        public const double MinHeartbeatIntervalS = 0.1;

        /// <summary>How often a hello that libzmq could not queue yet (no connection) is offered again, milliseconds.</summary>
        private const int HelloRetryMs = 10;

        /// <summary>A hello waiting for a connection (I/O thread only); requests queued after it wait behind it.</summary>
        private byte[][] _helloRetry;

        private const int MaxWaitMs = 100;
        private const int MaxMessagesPerWake = 256;
        private double _heartbeatIntervalS;
        private double _clientTimeoutS;
        private double _nextHeartbeatS = double.MaxValue;
        private double _lastReceivedS;
        private int _maxFrameBytes = WireCodec.DefaultMaxFrameBytes;

        private double NowS { get { return _clock.Elapsed.TotalSeconds; } }

        private void Log(string line)
        {
            var log = _options.Log;
            if (log != null)
            {
                try { log(line); } catch (Exception) { /* a failing logger must not kill the I/O thread */ }
            }
        }

        private void OnHello(HelloReply reply)
        {
            lock (_lock)
            {
                Hello = reply;
                _maxFrameBytes = (int)Math.Min(int.MaxValue, reply.Limits.MaxFrameBytes);
                _heartbeatIntervalS = Math.Max(MinHeartbeatIntervalS, reply.HeartbeatIntervalS);
                _clientTimeoutS = reply.ClientTimeoutS;
                _nextHeartbeatS = NowS + _heartbeatIntervalS;
            }
            _transport.Wake();
        }

        private void Enqueue(Header header, IgiRequest request, Pending pending, double timeoutS)
        {
            request.Validate();  // refused here with the code the daemon would give (grammar and json_schema both set, ...)
            byte[][] frames;
            try { frames = WireCodec.Encode(header, request, _signer); }
            catch (ArgumentException e)  // e.g. text with a lone UTF-16 surrogate: no valid UTF-8 to send
            {
                throw new IgiProtocolException(request.Type + " cannot be encoded: " + e.Message, e, "invalid_request");
            }
            pending.MsgId = header.MsgId;
            pending.RequestType = request.Type;
            pending.ReplyType = request.ReplyType;
            pending.TimeoutS = timeoutS;
            lock (_lock)
            {
                if (_stopping) throw new IgiClientClosedException("the client is closed");
                if (!_daemonAlive) throw new IgiTimeoutException("the daemon stopped answering; reconnect");
                pending.DeadlineS = NowS + timeoutS;
                _pending[header.MsgId] = pending;
            }
            _outbox.Enqueue(frames);
            _transport.Wake();
        }

        private void IoLoop()
        {
            try
            {
                _lastReceivedS = NowS;
                while (!_stopping)
                {
                    FlushOutbox();
                    byte[][] frames;
                    int received = 0;
                    int waitMs = WaitBudgetMs();
                    while (received < MaxMessagesPerWake && _transport.TryReceive(received == 0 ? waitMs : 0, out frames))
                    {
                        received++;
                        _lastReceivedS = NowS;
                        Receive(frames);
                    }
                    CheckTimers();
                }
            }
            catch (Exception e)
            {
                Log("IgiClient I/O thread failed: " + e);
                _daemonAlive = false;
                FailAll(() => new IgiTransportException("the client's I/O thread failed: " + e.Message, e));
            }
            finally
            {
                _transport.Dispose();
            }
        }

        private int WaitBudgetMs()
        {
            if (!_outbox.IsEmpty && _helloRetry == null) return 0;
            double now = NowS;
            double next = now + (_helloRetry != null ? HelloRetryMs : MaxWaitMs) / 1000.0;
            lock (_lock)
            {
                next = Math.Min(next, _nextHeartbeatS);
                foreach (var p in _pending.Values) next = Math.Min(next, p.DeadlineS);
            }
            return (int)Math.Max(0, Math.Ceiling((next - now) * 1000.0));
        }

        private void FlushOutbox()
        {
            if (_helloRetry != null)
            {
                byte[][] hello = _helloRetry;
                _helloRetry = null;
                if (!SendOrFail(hello, true)) { _helloRetry = hello; return; }
            }
            byte[][] frames;
            while (_outbox.TryDequeue(out frames))
            {
                if (!SendOrFail(frames, false)) { _helloRetry = frames; return; }
            }
        }

        /// <summary>
        /// Sends one request, or fails its pending entry with the transport's error. Returns false for a hello libzmq
        /// could not queue yet (EAGAIN: no connection, the handshake is under way or was refused and is retried), which
        /// is sent again until its own deadline answers it with <see cref="IgiTimeoutException"/>, as a daemon that does
        /// not answer (PROTOCOL.md 1.5: a peer without the credential is not answered).
        /// </summary>
        private bool SendOrFail(byte[][] frames, bool retry)
        {
            if (retry && PendingOf(frames) == null) return true;  // the hello timed out meanwhile: nothing to send
            try
            {
                _transport.Send(frames);
                return true;
            }
            catch (IgiTransportException e)
            {
                Pending pending = PendingOf(frames);
                if (pending == null) return true;
                // An unsent heartbeat stays outstanding, so that a daemon that cannot be reached (e.g. the connection
                // was dropped for a frame over ZMQ_MAXMSGSIZE, which libzmq does not re-establish) is declared gone
                // after client_timeout_s of silence (PROTOCOL.md section 11), like one that stopped answering.
                if (pending.IsHeartbeat) return true;
                if (pending.RequestType == HelloRequest.TypeName && Igi.Transport.ZmqNative.IsEagain(e.Errno)) return false;
                Pending p = Take(pending.MsgId);
                if (p != null) Fail(p, e);
                return true;
            }
        }

        /// <summary>The request in flight that an encoded message belongs to (null: none, e.g. a fire-and-forget one).</summary>
        private Pending PendingOf(byte[][] frames)
        {
            string msgId = WireCodec.DecodeHeader(frames[2]).MsgId;
            Pending pending;
            lock (_lock) { _pending.TryGetValue(msgId, out pending); }
            return pending;
        }

        private void Receive(byte[][] frames)
        {
            Header header;
            IgiMessage message;
            try
            {
                WireCodec.CheckFrames(frames);
                if (!_signer.Verify(frames[1], frames[2], frames[3])) throw new IgiSignatureException("HMAC-SHA256 signature does not match");
                header = WireCodec.DecodeHeader(frames[2], _maxFrameBytes);
            }
            catch (IgiProtocolException e)
            {
                Drop(e);
                return;
            }
            try
            {
                message = WireCodec.DecodeContent(header, frames[3], _maxFrameBytes);
            }
            catch (IgiProtocolException e)
            {
                // PROTOCOL.md sections 2 and 5.9: a client drops a message it cannot read (oversized, undecodable, unknown
                // type), even an authentic one. Its request is left in flight: a later readable reply or its timeout ends it.
                Drop(e);
                return;
            }
            var error = message as ErrorReply;
            if (error != null && IsDuplicateMsgId(error))
            {
                // PROTOCOL.md section 6.6: the answer to a request that reused a msg_id still in progress. Its parent_id
                // names that first request, which goes on: this is not its terminal reply.
                System.Threading.Interlocked.Increment(ref _droppedMessages);
                Log("dropped an error_reply with detail.duplicate_msg_id (parent " + (header.ParentId ?? "nil") + "): not the terminal reply of the request in flight");
                return;
            }
            Dispatch(header, message);
        }

        private static bool IsDuplicateMsgId(ErrorReply error)
        {
            object flag;
            return error.Detail != null && error.Detail.TryGetValue("duplicate_msg_id", out flag) && flag is bool && (bool)flag;
        }

        private void Drop(IgiProtocolException e)
        {
            System.Threading.Interlocked.Increment(ref _droppedMessages);
            Log("dropped a message (" + e.Classification + "): " + e.Message);
        }

        private void Dispatch(Header header, IgiMessage message)
        {
            Pending p;
            var token = message as TokenEvent;
            lock (_lock)
            {
                if (header.ParentId == null || !_pending.TryGetValue(header.ParentId, out p))
                {
                    Log("ignored " + header.Type + " with no request in flight (parent " + (header.ParentId ?? "nil") + ")");
                    return;
                }
                if (token != null && p.Handle != null)
                {
                    p.DeadlineS = NowS + p.TimeoutS;  // idle timeout restarts with every token
                }
                else
                {
                    _pending.Remove(header.ParentId);
                }
            }
            if (token != null)
            {
                if (p.Handle == null)
                {
                    Take(p.MsgId);
                    Fail(p, new IgiProtocolException("token_event for a " + p.RequestType));
                    return;
                }
                p.Handle.Append(token);
                var onToken = p.OnToken;
                if (onToken != null) _callbacks.Post(() => onToken(token));
                return;
            }
            var error = message as ErrorReply;
            if (error != null) Fail(p, ErrorCodes.ToException(error));
            else if (message.Type == p.ReplyType) Complete(p, message);
            else Fail(p, new IgiProtocolException("expected " + p.ReplyType + " for " + p.RequestType + ", got " + message.Type));
        }

        private Pending Take(string msgId)
        {
            lock (_lock)
            {
                Pending p;
                if (!_pending.TryGetValue(msgId, out p)) return null;
                _pending.Remove(msgId);
                return p;
            }
        }

        // Callbacks are queued before the task completes, so a Pump after awaiting the task delivers them.
        private void Complete(Pending p, IgiMessage reply)
        {
            var onDone = p.OnDone;
            var generateReply = reply as GenerateReply;
            if (onDone != null && generateReply != null) _callbacks.Post(() => onDone(generateReply));
            if (p.Tcs != null) p.Tcs.TrySetResult(reply);
        }

        private void Fail(Pending p, IgiException error)
        {
            var onError = p.OnError;
            if (onError != null) _callbacks.Post(() => onError(error));
            if (p.Tcs != null) p.Tcs.TrySetException(error);
        }

        private void FailAll(Func<IgiException> error)
        {
            List<Pending> all;
            lock (_lock)
            {
                all = new List<Pending>(_pending.Values);
                _pending.Clear();
            }
            foreach (var p in all) Fail(p, error());
        }

        private void CheckTimers()
        {
            double now = NowS;
            var expired = new List<Pending>();
            bool sendHeartbeat = false;
            bool gone = false;
            lock (_lock)
            {
                foreach (var p in _pending.Values)
                {
                    if (now < p.DeadlineS) continue;
                    expired.Add(p);
                    if (p.IsHeartbeat && now - _lastReceivedS >= _clientTimeoutS) gone = true;
                }
                if (gone)
                {
                    // PROTOCOL.md section 11.5: every outstanding request, expired or not, fails once with the liveness error.
                    _daemonAlive = false;
                    _nextHeartbeatS = double.MaxValue;
                    expired = new List<Pending>(_pending.Values);
                    _pending.Clear();
                }
                else
                {
                    foreach (var p in expired) _pending.Remove(p.MsgId);
                    if (now >= _nextHeartbeatS)
                    {
                        sendHeartbeat = true;
                        _nextHeartbeatS = now + _heartbeatIntervalS;
                    }
                }
            }
            if (gone)
            {
                Log("daemon silent for " + (now - _lastReceivedS).ToString("F1") + " s: declared gone");
                foreach (var p in expired)
                    if (!p.IsHeartbeat) Fail(p, new IgiTimeoutException("the daemon stopped answering (no message for " + _clientTimeoutS + " s)"));
                return;
            }
            foreach (var p in expired)
            {
                if (p.IsHeartbeat) continue;
                if (p.Handle != null) TrySend(new CancelRequest { TargetMsgId = p.MsgId });
                Fail(p, new IgiTimeoutException(p.RequestType + " got no " + (p.Handle != null ? "token or reply" : "reply") +
                                                " within " + p.TimeoutS + " s"));
            }
            if (sendHeartbeat)
            {
                var hb = new Pending { IsHeartbeat = true };
                var header = Header.New(HeartbeatRequest.TypeName);
                hb.MsgId = header.MsgId;
                hb.RequestType = HeartbeatRequest.TypeName;
                hb.ReplyType = HeartbeatReply.TypeName;
                hb.TimeoutS = _clientTimeoutS > 0 ? _clientTimeoutS : 10.0;
                hb.DeadlineS = now + hb.TimeoutS;
                lock (_lock) _pending[hb.MsgId] = hb;
                _outbox.Enqueue(WireCodec.Encode(header, new HeartbeatRequest(), _signer));
            }
        }

        // Fire-and-forget request from the I/O thread (its reply is ignored as having no request in flight).
        private void TrySend(IgiRequest request)
        {
            try { _outbox.Enqueue(WireCodec.Encode(Header.New(request.Type), request, _signer)); }
            catch (ArgumentException e) { Log("could not encode " + request.Type + ": " + e.Message); }
        }
    }
}
