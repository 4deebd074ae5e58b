// IgiClient receive-path behaviour against a raw ROUTER socket (forged signatures, error mapping, timeouts, close),
// and FrameBudgetHelper applying a scripted frame_stats_reply.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Igi.Budget;
using Igi.Client;
using Igi.MsgPack;
using Igi.Protocol;
using Igi.Transport;

namespace Igi.Tests
{
    public static class ClientUnitTests
    {
        private const string KeyHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

        private static ConnectionInfo InfoFor(TestRouter router, string ip = "127.0.0.1", string mechanism = null, string ipcPath = null)
        {
            string where = ipcPath != null ? "\"transport\": \"ipc\", \"ip\": \"" + ipcPath + "\", \"port\": 0"
                                            : "\"transport\": \"tcp\", \"ip\": \"" + ip + "\", \"port\": " + router.Port;
            return ConnectionInfo.Parse("{" + where + ", \"key\": \"" + KeyHex + "\", \"signature_scheme\": \"hmac-sha256\", " +
                                        "\"protocol_version\": \"1.0\", \"pid\": 1" +
                                        (mechanism != null ? ", \"zmq_mechanism\": \"" + mechanism + "\"" : "") + "}");
        }

        // An IIgiTransport that is not an IIgiHandshakeCredential (a transport written before protocol 1.2).
        private sealed class TransportWithoutCredential : IIgiTransport
        {
            private readonly ZmqDealerTransport _inner = new ZmqDealerTransport();
            public void Connect(string endpoint) { _inner.Connect(endpoint); }
            public void Send(IList<byte[]> frames) { _inner.Send(frames); }
            public bool TryReceive(int timeoutMs, out byte[][] frames) { return _inner.TryReceive(timeoutMs, out frames); }
            public void Wake() { _inner.Wake(); }
            public void Dispose() { _inner.Dispose(); }
        }

        // A transport whose first `refusals` sends (all of them when negative) fail as libzmq's do with no connection yet.
        private sealed class TransportNotConnectedYet : IIgiTransport
        {
            private readonly ZmqDealerTransport _inner = new ZmqDealerTransport();
            private int _refusals;
            public int Refused;
            public TransportNotConnectedYet(int refusals) { _refusals = refusals; }
            public void Connect(string endpoint) { _inner.Connect(endpoint); }
            public void Send(IList<byte[]> frames)
            {
                if (_refusals != 0)
                {
                    if (_refusals > 0) _refusals--;
                    Refused++;
                    throw new IgiTransportException("send queue full: the daemon is not reading (zmq EAGAIN)", ZmqNative.EAGAIN_LINUX);
                }
                _inner.Send(frames);
            }
            public bool TryReceive(int timeoutMs, out byte[][] frames) { return _inner.TryReceive(timeoutMs, out frames); }
            public void Wake() { _inner.Wake(); }
            public void Dispose() { _inner.Dispose(); }
        }

        // Connects a client to the router and answers its hello_reply.
        private static IgiClient ConnectTo(TestRouter router, Signer signer, out byte[] identity, HelloReply hello = null,
                                           IgiClientOptions options = null, string ip = "127.0.0.1")
        {
            Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router, ip), options);
            Envelope request = ReceiveRequest(router, signer, out identity);
            Check.Equal(HelloRequest.TypeName, request.Message.Type, "first message is hello");
            router.Send(identity, Reply(request, hello ?? GoodHello(), signer));
            return IgiClient.Wait(connecting);
        }

        // A correctly signed reply to `request` whose content frame is the given bytes (readable or not).
        private static byte[][] RawReply(Envelope request, string type, byte[] content, Signer signer)
        {
            var w = new MsgPackWriter();
            Header.New(type, request.Header.SessionId, request.Header.MsgId).Write(w);
            byte[] header = w.ToArray();
            return new[] { (byte[])WireCodec.Magic.Clone(), signer.Sign(header, content), header, content };
        }

        // Waits for a task to end without throwing (false when it is still running after timeoutMs).
        private static bool Ends(Task task, int timeoutMs)
        {
            try { return task.Wait(timeoutMs); }
            catch (AggregateException) { return true; }
        }

        private static Envelope ReceiveRequest(TestRouter router, Signer signer, out byte[] identity)
        {
            List<byte[]> frames = router.Receive(10000);
            Check.True(frames != null, "the router received a request");
            identity = frames[0];
            return WireCodec.Decode(frames.GetRange(1, frames.Count - 1), signer);
        }

        // Receives the next request that is not a heartbeat_request; heartbeats met on the way are answered.
        private static Envelope ReceiveSkippingHeartbeats(TestRouter router, Signer signer, out byte[] identity)
        {
            while (true)
            {
                Envelope request = ReceiveRequest(router, signer, out identity);
                if (request.Message.Type != HeartbeatRequest.TypeName) return request;
                router.Send(identity, Reply(request, new HeartbeatReply(), signer));
            }
        }

        private static byte[][] Reply(Envelope request, IgiMessage reply, Signer signer)
        {
            return WireCodec.Encode(Header.New(reply.Type, request.Header.SessionId, request.Header.MsgId), reply, signer);
        }

        private static HelloReply GoodHello()
        {
            // Heartbeats every 60 s: none during a test (0 would be read as MinHeartbeatIntervalS, 0.1 s).
            return new HelloReply { DaemonVersion = "test", ProtocolVersion = "1.0", HeartbeatIntervalS = 60, ClientTimeoutS = 10, Limits = new Limits() };
        }

        private static void PumpUntil(IgiClient client, Func<bool> done, string what)
        {
            var sw = Stopwatch.StartNew();
            while (!done())
            {
                client.Pump();
                if (sw.Elapsed.TotalSeconds > 10) throw new AssertionException("gave up waiting for " + what + " after 10 s");
                Thread.Sleep(2);
            }
        }

        public static void Register(TestRunner t)
        {
            t.Add("client:drops_forged_reply_then_accepts_authentic_one", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                var forger = new Signer(new byte[32]);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    Check.Equal(HelloRequest.TypeName, hello.Message.Type, "first message is hello");
                    Check.Equal("unity-plugin", ((HelloRequest)hello.Message).ClientName, "client name");
                    router.Send(identity, Reply(hello, GoodHello(), forger));
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        Check.Equal("test", client.Hello.DaemonVersion, "hello accepted");
                        Check.Equal(1L, client.DroppedMessages, "the forged reply was dropped");
                    }
                }
            });
            t.Add("client:error_reply_becomes_typed_exception", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    var error = new ErrorReply { Code = ErrorCodes.UnsupportedVersion, Message = "major 2 only" };
                    router.Send(identity, Reply(hello, error, signer));
                    var e = Check.Throws<IgiUnsupportedVersionException>(() => IgiClient.Wait(connecting), "handshake refused");
                    Check.Equal("unsupported_version", e.Code, "code");
                }
            });
            t.Add("client:request_without_reply_times_out", () =>
            {
                using (var router = new TestRouter())
                {
                    var options = new IgiClientOptions { HelloTimeoutS = 0.2 };
                    Check.Throws<IgiTimeoutException>(() => IgiClient.Connect(InfoFor(router), options), "no hello_reply");
                }
            });
            t.Add("client:callbacks_run_only_in_pump_in_order", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        int mainThread = System.Threading.Thread.CurrentThread.ManagedThreadId;
                        var events = new List<string>();
                        GenerateHandle handle = client.Generate("npc_1", "hello",
                            tok => { Check.Equal(mainThread, System.Threading.Thread.CurrentThread.ManagedThreadId, "token thread"); events.Add("token:" + tok.Text); },
                            done => { Check.Equal(mainThread, System.Threading.Thread.CurrentThread.ManagedThreadId, "done thread"); events.Add("done:" + done.FinishReason); },
                            err => events.Add("error:" + err.Message));
                        Envelope gen = ReceiveRequest(router, signer, out identity);
                        Check.Equal(handle.MsgId, gen.Header.MsgId, "handle id is the request id");
                        Check.Equal("npc_1", gen.Header.SessionId, "session id in header");
                        router.Send(identity, Reply(gen, new TokenEvent { Index = 0, Text = "Hi", TokenId = 7 }, signer));
                        router.Send(identity, Reply(gen, new TokenEvent { Index = 1, Text = "!", TokenId = 8 }, signer));
                        router.Send(identity, Reply(gen, new GenerateReply { FinishReason = "stop", Text = "Hi!", Usage = new Usage { PromptTokens = 3, CompletionTokens = 2 }, TtftS = 0.1, Tps = 20 }, signer));
                        GenerateReply final = IgiClient.Wait(handle.Completion);
                        Check.Equal("Hi!", final.Text, "completion task");
                        Check.Equal("Hi!", handle.TextSoFar, "text so far");
                        Check.Equal(0, events.Count, "no callback before Pump");
                        Check.Equal(3, client.Pump(), "three callbacks pumped");
                        Check.Equal("token:Hi|token:!|done:stop", string.Join("|", events), "order");
                        Check.Equal(0, client.PendingRequests, "nothing pending");
                    }
                }
            });
            t.Add("client:sends_heartbeats_and_declares_a_silent_daemon_gone", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    var fast = GoodHello();
                    fast.HeartbeatIntervalS = 0.05;
                    fast.ClientTimeoutS = 0.5;
                    router.Send(identity, Reply(hello, fast, signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        Task<StatusReply> status = client.StatusAsync();  // its own timeout is 30 s
                        var seen = new List<string>();
                        while (seen.Count < 3)
                            seen.Add(ReceiveRequest(router, signer, out identity).Message.Type);
                        Check.True(seen.Contains(HeartbeatRequest.TypeName), "heartbeats sent: " + string.Join(",", seen));
                        var e = Check.Throws<IgiTimeoutException>(() => IgiClient.Wait(status), "silent daemon");
                        Check.True(e.Message.Contains("stopped answering"), "liveness failure, not the request timeout: " + e.Message);
                        Check.True(!client.IsDaemonAlive, "declared gone");
                    }
                }
            });
            t.Add("client:heartbeat_interval_under_the_minimum_is_read_as_the_minimum", () =>
            {
                // A daemon announcing 1e-6 s (or 0) gets heartbeats at most every MinHeartbeatIntervalS (0.1 s), not a busy loop.
                var signer = Signer.FromHex(KeyHex);
                foreach (double announced in new[] { 1e-6, 0.0 })
                {
                    using (var router = new TestRouter())
                    {
                        var sw = Stopwatch.StartNew();  // started before the hello: no heartbeat can predate it
                        var tiny = GoodHello();
                        tiny.HeartbeatIntervalS = announced;
                        byte[] identity;
                        using (IgiClient client = ConnectTo(router, signer, out identity, tiny))
                        {
                            int heartbeats = 0;
                            while (heartbeats < 2 || sw.Elapsed.TotalSeconds < 0.5)
                            {
                                Envelope request = ReceiveRequest(router, signer, out identity);
                                Check.Equal(HeartbeatRequest.TypeName, request.Message.Type, announced + ": only heartbeats are sent");
                                router.Send(identity, Reply(request, new HeartbeatReply(), signer));
                                heartbeats++;
                                Check.True(heartbeats <= 1000, announced + ": over 1000 heartbeats in " + sw.Elapsed.TotalSeconds.ToString("F3") + " s");
                            }
                            double elapsed = sw.Elapsed.TotalSeconds;
                            // At most one per MinHeartbeatIntervalS since the hello; the +2 and x1.5 are slack, not timing.
                            int most = 2 + (int)(1.5 * elapsed / IgiClient.MinHeartbeatIntervalS);
                            Check.True(heartbeats <= most, announced + ": " + heartbeats + " heartbeats in " + elapsed.ToString("F3") + " s (at most " + most + ")");
                            Check.True(client.IsDaemonAlive, announced + ": the daemon answered every heartbeat");
                        }
                    }
                }
            });
            t.Add("client:frame_budget_helper_applies_the_daemon_throttle", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        var helper = new FrameBudgetHelper(client, 1000.0 / 60.0, 0.1);
                        var changes = new List<Throttle>();
                        var proposals = new List<long>();
                        IgiException failure = null;
                        helper.ThrottleChanged += th => changes.Add(th);
                        helper.BudgetProposed += mib => proposals.Add(mib);
                        helper.Failed += e => failure = e;
                        Check.Equal(int.MaxValue, helper.PumpBudget, "no throttle before the first reply: unlimited pumping");

                        // One window of 20 ms frames -> one frame_stats_request; the fake daemon answers it with `reply`.
                        Action<FrameStatsReply, string> round = (reply, what) =>
                        {
                            int before = helper.RepliesReceived;
                            int sent = 0;
                            for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020) ? 1 : 0;
                            Check.Equal(1, sent, what + ": one report per 0.1 s window");
                            Envelope stats = ReceiveRequest(router, signer, out identity);
                            Check.Equal(FrameStatsRequest.TypeName, stats.Message.Type, what + ": request type");
                            var request = (FrameStatsRequest)stats.Message;
                            Check.True(Math.Abs(request.FrameTimeMs - 20.0) < 1e-9, what + ": p95 frame time sent, got " + request.FrameTimeMs);
                            Check.True(Math.Abs(request.TargetFrameTimeMs - 1000.0 / 60.0) < 1e-9, what + ": target frame time sent");
                            router.Send(identity, Reply(stats, reply, signer));
                            PumpUntil(client, () => helper.RepliesReceived > before || failure != null, what + ": frame_stats_reply");
                            Check.True(failure == null, what + ": no failure: " + (failure == null ? "" : failure.Message));
                            Check.Equal(before + 1, helper.RepliesReceived, what + ": replies received");
                        };

                        round(new FrameStatsReply { Throttle = new Throttle { TokensPerFrame = 2, SleepMsBetweenTokens = 50 }, ProposedBudgetMib = 768 }, "throttled");
                        Check.Equal((long?)2, helper.Throttle.TokensPerFrame, "throttle.tokens_per_frame applied");
                        Check.Equal(50.0, helper.Throttle.SleepMsBetweenTokens, "throttle.sleep_ms_between_tokens applied");
                        Check.Equal(2, helper.PumpBudget, "pump budget = tokens_per_frame (terminal callbacks share it)");
                        int ran = 0;
                        for (int i = 0; i < 5; i++) client.Post(() => ran++);  // five token callbacks queued at once
                        Check.Equal(2, client.Pump(helper.PumpBudget), "one frame pumps at most tokens_per_frame callbacks");
                        Check.Equal(2, ran, "callbacks run in the first frame");
                        Check.Equal(3, client.Pump(helper.PumpBudget) + client.Pump(helper.PumpBudget), "the rest in later frames");
                        Check.Equal(1, changes.Count, "ThrottleChanged raised for the new throttle");
                        Check.Equal((long?)2, changes[0].TokensPerFrame, "ThrottleChanged carries the new throttle");
                        Check.Equal((long?)768, helper.ProposedBudgetMib, "proposed budget kept");
                        Check.Equal("768", string.Join(",", proposals), "BudgetProposed raised once with the proposal");

                        round(new FrameStatsReply { Throttle = new Throttle { TokensPerFrame = 2, SleepMsBetweenTokens = 50 } }, "same throttle");
                        Check.Equal(1, changes.Count, "ThrottleChanged not raised when the throttle is unchanged");
                        Check.Equal(2, helper.PumpBudget, "pump budget unchanged");
                        Check.Equal((long?)null, helper.ProposedBudgetMib, "no proposal in the second reply");
                        Check.Equal(1, proposals.Count, "BudgetProposed not raised without a proposal");

                        round(new FrameStatsReply { Throttle = new Throttle() }, "unthrottled");
                        Check.Equal((long?)null, helper.Throttle.TokensPerFrame, "tokens_per_frame nil applied");
                        Check.Equal(0.0, helper.Throttle.SleepMsBetweenTokens, "sleep 0 applied");
                        Check.Equal(int.MaxValue, helper.PumpBudget, "unlimited pumping again");
                        Check.Equal(2, changes.Count, "ThrottleChanged raised when the throttle is lifted");
                    }
                }
            });
            t.Add("budget:frame_time_window_is_bounded_and_finite", () =>
            {
                var window = new FrameTimeWindow(0.5);
                int full = -1;
                for (int i = 0; i < 5000 && full < 0; i++) if (window.AddFrame(0.0)) full = i + 1;
                Check.Equal(FrameTimeWindow.MaxFrames, full, "zero-length frames fill the window at MaxFrames");
                window.TakeSummary();
                window.AddFrame(1e306);
                FrameTimeSummary huge = window.TakeSummary();
                Check.Equal(FrameTimeWindow.MaxFrameTimeMs, huge.P95Ms, "a 1e306 s frame is cut to the longest the governor reads");
                Check.True(!double.IsInfinity(huge.MeanMs), "the mean stays finite");
                // The interval fills the window; the statistics are of the busy time (NaN: the interval).
                Check.True(!window.AddFrame(0.2, 0.004), "0.2 s of 0.5 s");
                Check.True(!window.AddFrame(0.2, double.NaN), "0.4 s of 0.5 s");
                Check.True(window.AddFrame(0.2, 0.006), "full at 0.6 s of intervals");
                FrameTimeSummary busy = window.TakeSummary();
                Check.Equal(3, busy.FrameCount, "three frames");
                Check.Equal(200.0, busy.MaxMs, "the frame without a busy time reports its interval");
                Check.True(Math.Abs(busy.MeanMs - (4.0 + 200.0 + 6.0) / 3) < 1e-9, "busy times, not intervals: " + busy.MeanMs);
            });
            t.Add("client:frame_budget_helper_keeps_its_range_and_frames_and_drops_stale_proposals", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        var helper = new FrameBudgetHelper(client, 1000.0 / 60.0, 0.1) { AutoAcceptProposals = true };
                        IgiException failure = null;
                        helper.Failed += e => failure = e;
                        Check.Throws<ArgumentOutOfRangeException>(() => helper.SetProposalRange(4096, 1024), "minimum above maximum");
                        Check.Throws<ArgumentOutOfRangeException>(() => helper.MinBudgetMib = -1, "negative minimum");
                        helper.SetProposalRange(1024, 4096);
                        Check.Throws<ArgumentOutOfRangeException>(() => helper.MaxBudgetMib = 512, "maximum below the minimum");

                        int sent = 0;
                        for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020, 0.010) ? 1 : 0;
                        Check.Equal(1, sent, "one report per 0.1 s window");
                        Envelope stats = ReceiveRequest(router, signer, out identity);
                        Check.Equal(10.0, ((FrameStatsRequest)stats.Message).FrameTimeMs, "the busy time's p95 is sent");
                        // While the report is in flight, the frames go into the next window: a spike is not lost.
                        sent = 0;
                        for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020, frame == 2 ? 0.5 : 0.010) ? 1 : 0;
                        Check.Equal(0, sent, "no report while one is in flight");
                        router.Send(identity, Reply(stats, new FrameStatsReply { Throttle = new Throttle(), ProposedBudgetMib = 512 }, signer));
                        PumpUntil(client, () => helper.RepliesReceived == 1, "first frame_stats_reply");
                        Check.Equal((long?)512L, helper.ProposedBudgetMib, "a proposal under the minimum is reported");

                        Check.True(helper.AddFrame(0.020, 0.010), "the kept window is full: reported at the next frame");
                        stats = ReceiveRequest(router, signer, out identity);
                        Check.Equal(FrameStatsRequest.TypeName, stats.Message.Type, "not applied: no set_budget_request");
                        Check.Equal(500.0, ((FrameStatsRequest)stats.Message).FrameTimeMs, "the spike from while the last report was in flight");
                        router.Send(identity, Reply(stats, new FrameStatsReply { Throttle = new Throttle(), ProposedBudgetMib = 1536 }, signer));
                        PumpUntil(client, () => helper.RepliesReceived == 2, "second frame_stats_reply");
                        Envelope accepted = ReceiveRequest(router, signer, out identity);
                        Check.Equal(1536L, ((SetBudgetRequest)accepted.Message).VramBudgetMib, "a proposal in the range is applied");
                        router.Send(identity, Reply(accepted, new BudgetAck { RequestedMib = 1536, GrantedMib = 1536, Applied = true }, signer));

                        sent = 0;
                        for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020) ? 1 : 0;
                        Check.Equal(1, sent, "the third report");
                        stats = ReceiveRequest(router, signer, out identity);
                        // The game sets its own budget before the reply comes: the proposal in it is for the budget before.
                        helper.SetBudget(2048, "explicit");
                        Envelope own = ReceiveRequest(router, signer, out identity);
                        Check.Equal(2048L, ((SetBudgetRequest)own.Message).VramBudgetMib, "the game's budget");
                        router.Send(identity, Reply(own, new BudgetAck { RequestedMib = 2048, GrantedMib = 2048, Applied = true }, signer));
                        router.Send(identity, Reply(stats, new FrameStatsReply { Throttle = new Throttle(), ProposedBudgetMib = 1280 }, signer));
                        PumpUntil(client, () => helper.RepliesReceived == 3, "third frame_stats_reply");
                        Check.Equal((long?)null, helper.ProposedBudgetMib, "a proposal made before the game's budget is dropped");
                        sent = 0;
                        for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020) ? 1 : 0;
                        Check.Equal(1, sent, "the next report");
                        Envelope next = ReceiveRequest(router, signer, out identity);
                        Check.Equal(FrameStatsRequest.TypeName, next.Message.Type, "no set_budget_request for the stale proposal");
                        Check.True(failure == null, "no failure: " + (failure == null ? "" : failure.Message));
                    }
                }
            });
            t.Add("client:liveness_failure_fails_every_expired_request_once", () =>
            {
                // The daemon falls silent with a heartbeat and several short-deadline requests outstanding. The I/O thread
                // is held (its log callback sleeps) past every deadline, so one timer tick sees the heartbeat and all the
                // requests expired at once: each request must still fail, exactly once.
                var signer = Signer.FromHex(KeyHex);
                var hold = new ManualResetEventSlim(false);
                int held = 0;
                var options = new IgiClientOptions
                {
                    GenerateIdleTimeoutS = 0.3,
                    Log = line =>
                    {
                        if (line.StartsWith("ignored", StringComparison.Ordinal) && Interlocked.Exchange(ref held, 1) == 0)
                        {
                            hold.Set();
                            Thread.Sleep(1500);
                        }
                    },
                };
                var fast = GoodHello();
                fast.HeartbeatIntervalS = 0.05;
                fast.ClientTimeoutS = 0.6;
                using (var router = new TestRouter())
                {
                    byte[] identity;
                    using (IgiClient client = ConnectTo(router, signer, out identity, fast, options))
                    {
                        Envelope heartbeat = ReceiveRequest(router, signer, out identity);
                        Check.Equal(HeartbeatRequest.TypeName, heartbeat.Message.Type, "a heartbeat is outstanding (never answered)");
                        var tasks = new List<Task>();
                        for (int i = 0; i < 3; i++) tasks.Add(client.SendAsync(new StatusRequest(), null, 0.3));
                        var errors = new List<IgiException>();
                        int done = 0;
                        GenerateHandle gen = client.Generate("npc_1", "hello", null, r => done++, e => errors.Add(e));
                        tasks.Add(gen.Completion);
                        for (int i = 0; i < 3; i++) tasks.Add(client.SendAsync(new StatusRequest(), null, 0.3));
                        // A reply for no request in flight: the client logs it, and the log callback holds the I/O thread.
                        router.Send(identity, WireCodec.Encode(Header.New(HeartbeatReply.TypeName, null, Header.NewMsgId()), new HeartbeatReply(), signer));
                        Check.True(hold.Wait(5000), "the I/O thread was held");
                        for (int i = 0; i < tasks.Count; i++)
                        {
                            Check.True(Ends(tasks[i], 5000), "request " + i + " failed (its task ended) after the daemon was declared gone");
                            Check.True(tasks[i].IsFaulted, "request " + i + " faulted");
                            var e = tasks[i].Exception.GetBaseException();
                            Check.True(e is IgiTimeoutException, "request " + i + ": a timeout-like error, got " + e.GetType().Name + ": " + e.Message);
                        }
                        Check.True(!client.IsDaemonAlive, "declared gone");
                        Thread.Sleep(200);  // no later tick may fail anything again
                        client.Pump();
                        Check.Equal(1, errors.Count, "onError ran exactly once for the generation");
                        Check.Equal(0, done, "onDone never ran");
                        Check.Equal(0, client.PendingRequests, "nothing left in flight (no more heartbeats once gone)");
                    }
                }
            });
            t.Add("client:duplicate_msg_id_error_reply_does_not_end_the_generation", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    byte[] identity;
                    using (IgiClient client = ConnectTo(router, signer, out identity))
                    {
                        var events = new List<string>();
                        GenerateHandle handle = client.Generate("npc_1", "hello", tok => events.Add("token:" + tok.Text),
                                                                done => events.Add("done:" + done.FinishReason), err => events.Add("error:" + err.Message));
                        Envelope gen = ReceiveRequest(router, signer, out identity);
                        router.Send(identity, Reply(gen, new TokenEvent { Index = 0, Text = "Hi", TokenId = 7 }, signer));
                        var duplicate = new ErrorReply
                        {
                            Code = ErrorCodes.InvalidRequest,
                            Message = "msg_id already in progress",
                            Detail = new MsgPackMap().Add("duplicate_msg_id", true),
                        };
                        router.Send(identity, Reply(gen, duplicate, signer));
                        router.Send(identity, Reply(gen, new TokenEvent { Index = 1, Text = "!", TokenId = 8 }, signer));
                        router.Send(identity, Reply(gen, new GenerateReply { FinishReason = "stop", Text = "Hi!", Usage = new Usage { PromptTokens = 3, CompletionTokens = 2 } }, signer));
                        Check.True(Ends(handle.Completion, 10000), "the generation ended");
                        Check.True(handle.Completion.Status == TaskStatus.RanToCompletion,
                                   "completed normally, not failed: " + (handle.Completion.Exception == null ? "" : handle.Completion.Exception.GetBaseException().Message));
                        Check.Equal("Hi!", handle.Completion.Result.Text, "the generate_reply ended it");
                        Check.Equal("Hi!", handle.TextSoFar, "both tokens delivered");
                        client.Pump();
                        Check.Equal("token:Hi|token:!|done:stop", string.Join("|", events), "callbacks");
                        Check.Equal(1L, client.DroppedMessages, "the duplicate_msg_id error_reply was dropped and counted");
                        Check.Equal(0, client.PendingRequests, "nothing pending");
                    }
                }
            });
            t.Add("client:unreadable_reply_is_dropped_and_its_request_stays_in_flight", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    byte[] identity;
                    using (IgiClient client = ConnectTo(router, signer, out identity))
                    {
                        int errors = 0;
                        GenerateHandle handle = client.Generate("npc_1", "hello", null, null, err => errors++);
                        Envelope gen = ReceiveRequest(router, signer, out identity);
                        // Authentic, but the content cannot be read: required fields missing, then a frame over max_frame_bytes.
                        router.Send(identity, RawReply(gen, GenerateReply.TypeName, new byte[] { 0x80 }, signer));
                        router.Send(identity, RawReply(gen, GenerateReply.TypeName, new byte[new Limits().MaxFrameBytes + 1], signer));
                        var sw = Stopwatch.StartNew();
                        while (client.DroppedMessages < 2 && sw.Elapsed.TotalSeconds < 10) Thread.Sleep(2);
                        Check.Equal(2L, client.DroppedMessages, "both unreadable replies dropped and counted");
                        Thread.Sleep(50);
                        client.Pump();
                        Check.True(!handle.Completion.IsCompleted, "the request is not ended by a reply it cannot read");
                        Check.Equal(0, errors, "no onError");
                        Check.Equal(1, client.PendingRequests, "the generation is still in flight");
                        router.Send(identity, Reply(gen, new GenerateReply { FinishReason = "stop", Text = "ok", Usage = new Usage() }, signer));
                        Check.Equal("ok", IgiClient.Wait(handle.Completion).Text, "a later readable reply ends it");
                    }
                }
            });
            t.Add("client:handshakes_again_on_a_socket_capped_at_twice_the_announced_max_frame_bytes", () =>
            {
                // PROTOCOL.md 1.4 / 10: replies are decoded with hello_reply.limits.max_frame_bytes, and the socket's
                // ZMQ_MAXMSGSIZE is twice it. libzmq applies that option only to later connections, so a daemon announcing
                // 4096 gets a second hello on a fresh socket capped at 8192.
                var signer = Signer.FromHex(KeyHex);
                var small = GoodHello();
                small.Limits = new Limits { MaxFrameBytes = 4096, PriorityAgeingPerS = 2.5 };
                small.HeartbeatIntervalS = 0.05;
                small.ClientTimeoutS = 1.0;
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] first, second;
                    Envelope hello1 = ReceiveRequest(router, signer, out first);
                    Check.Equal(HelloRequest.TypeName, hello1.Message.Type, "first handshake");
                    router.Send(first, Reply(hello1, small, signer));
                    Envelope hello2 = ReceiveRequest(router, signer, out second);
                    Check.Equal(HelloRequest.TypeName, hello2.Message.Type, "a second hello_request, for the announced cap");
                    Check.True(Check.Hex(first) != Check.Hex(second), "the second hello comes from a new connection");
                    router.Send(second, Reply(hello2, small, signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                    {
                        Check.Equal(4096L, client.Hello.Limits.MaxFrameBytes, "announced limit");
                        Check.Equal(2.5, client.Hello.Limits.PriorityAgeingPerS, "announced priority ageing (1.4)");
                        Check.Equal((long?)8192, client.MaxMessageBytes, "socket cap = 2 x max_frame_bytes");
                        Task<StatusReply> status = client.StatusAsync();
                        byte[] identity;
                        Envelope request = ReceiveSkippingHeartbeats(router, signer, out identity);
                        Check.Equal(Check.Hex(second), Check.Hex(identity), "requests go out on the second connection");
                        // Over max_frame_bytes but under the cap: delivered, then dropped by the decoder (too_large).
                        router.Send(identity, RawReply(request, StatusReply.TypeName, new byte[5000], signer));
                        var sw = Stopwatch.StartNew();
                        while (client.DroppedMessages < 1 && sw.Elapsed.TotalSeconds < 10) Thread.Sleep(2);
                        Check.Equal(1L, client.DroppedMessages, "a 5000-byte frame is dropped by the decoder (limit 4096)");
                        router.Send(identity, Reply(request, new StatusReply { UptimeS = 1 }, signer));
                        Check.Equal(1.0, IgiClient.Wait(status).UptimeS, "the connection stays up: a readable reply follows");
                        // Over the cap: libzmq drops the connection (for good: a protocol error is not reconnected), so the
                        // frame never reaches the client, and the silent daemon is declared gone after client_timeout_s.
                        Task<StatusReply> again = client.StatusAsync();
                        Envelope request2 = ReceiveSkippingHeartbeats(router, signer, out identity);
                        router.Send(identity, RawReply(request2, StatusReply.TypeName, new byte[3 * 4096], signer));
                        var e = Check.Throws<IgiTimeoutException>(() => IgiClient.Wait(again), "no reply after the connection was cut");
                        Check.True(e.Message.Contains("stopped answering"), "the liveness error, not the 30 s request timeout: " + e.Message);
                        Check.True(!client.IsDaemonAlive, "declared gone");
                        Check.Equal(1L, client.DroppedMessages, "the frame over the cap never reached the decoder");
                    }
                }
                Check.Equal(2L * 1048576, IgiClient.MaxMessageBytesFor(1048576), "cap of the default limit");
                Check.Equal(-1L, IgiClient.MaxMessageBytesFor(long.MaxValue), "no cap past the int64 range");
            });
            t.Add("client:presents_the_plain_credential_the_connection_file_names", () =>
            {
                // PROTOCOL.md 1.5: a daemon whose file says "zmq_mechanism": "plain" lets in only the derived credential.
                var signer = Signer.FromHex(KeyHex);
                byte[] password = ConnectionInfo.DerivePlainPassword(Hex.Decode(KeyHex));
                using (var router = new TestRouter(plainPassword: password))
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router, mechanism: "plain"));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    using (IgiClient client = IgiClient.Wait(connecting))
                        Check.Equal("test", client.Hello.DaemonVersion, "handshake through the PLAIN server");
                    Check.Equal(1, router.ZapAccepted, "one PLAIN handshake, accepted");
                    Check.Equal(0, router.ZapRefused, "none refused");
                    // The same file without the field (a daemon before 1.2): no credential, so the PLAIN server never lets it in.
                    var options = new IgiClientOptions { HelloTimeoutS = 0.5 };
                    Check.Throws<IgiTimeoutException>(() => IgiClient.Connect(InfoFor(router), options), "no credential: no answer");
                    Check.True(router.Receive(200) == null, "nothing of it reached the socket");
                }
            });
            t.Add("client:a_hello_libzmq_cannot_queue_yet_is_sent_again_until_its_deadline", () =>
            {
                // No connection yet (the handshake under way, or refused and retried): the hello waits for one, and a
                // daemon that never lets the client in is "no answer" at the hello timeout, not a transport error.
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    var late = new TransportNotConnectedYet(3);
                    var options = new IgiClientOptions { TransportFactory = () => late };
                    byte[] identity;
                    using (IgiClient client = ConnectTo(router, signer, out identity, options: options))
                        Check.Equal("test", client.Hello.DaemonVersion, "the hello went out once a send was taken");
                    Check.Equal(3, late.Refused, "three sends refused before");
                    var never = new IgiClientOptions { HelloTimeoutS = 0.3, TransportFactory = () => new TransportNotConnectedYet(-1) };
                    Check.Throws<IgiTimeoutException>(() => IgiClient.Connect(InfoFor(router), never), "never connected: no answer");
                }
            });
            t.Add("client:refuses_a_transport_that_cannot_present_the_credential", () =>
            {
                using (var router = new TestRouter())
                {
                    var options = new IgiClientOptions { TransportFactory = () => new TransportWithoutCredential() };
                    var e = Check.Throws<IgiTransportException>(() => IgiClient.Connect(InfoFor(router, mechanism: "plain"), options),
                                                                "a plain daemon and a transport without IIgiHandshakeCredential");
                    Check.True(e.Message.Contains("zmq_mechanism"), "the message says why: " + e.Message);
                }
            });
            if (!ZmqNative.IsWindows)
                t.Add("client:connects_over_ipc", () =>
                {
                    var signer = Signer.FromHex(KeyHex);
                    string dir = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "igi-cs-" + Guid.NewGuid().ToString("N").Substring(0, 8));
                    System.IO.Directory.CreateDirectory(dir);
                    try
                    {
                        string path = System.IO.Path.Combine(dir, "daemon.sock");
                        using (var router = new TestRouter(ipcPath: path))
                        {
                            Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router, ipcPath: path));
                            byte[] identity;
                            Envelope hello = ReceiveRequest(router, signer, out identity);
                            router.Send(identity, Reply(hello, GoodHello(), signer));
                            using (IgiClient client = IgiClient.Wait(connecting))
                            {
                                Check.Equal("ipc://" + path, client.Connection.Endpoint, "ipc endpoint from the file");
                                Check.Equal("test", client.Hello.DaemonVersion, "handshake over ipc://");
                            }
                        }
                    }
                    finally { System.IO.Directory.Delete(dir, true); }
                });
            t.Add("client:requests_the_daemon_would_refuse_as_invalid_request_are_not_sent", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                byte[] identity;
                using (var router = new TestRouter())
                using (IgiClient client = ConnectTo(router, signer, out identity))
                {
                    var both = new GenerateRequest { Text = "hi", Grammar = "root ::= \"yes\"", JsonSchema = "{\"type\": \"boolean\"}" };
                    var e = Check.Throws<IgiProtocolException>(() => client.Generate("s1", both, null, null, null), "grammar and json_schema");
                    Check.Equal("invalid_request", e.Classification, "classification");
                    var twice = new CreateSessionRequest { Persona = "p", Tools = { new Tool { Name = "give_item" }, new Tool { Name = "give_item" } } };
                    e = Check.Throws<IgiProtocolException>(() => IgiClient.Wait(client.CreateSessionAsync(twice)), "duplicate tool names");
                    Check.Equal("invalid_request", e.Classification, "classification");
                    // The next request the daemon sees is the valid one: neither refused request left the client.
                    Task<string> created = client.CreateSessionAsync(new CreateSessionRequest { Persona = "p", Tools = { new Tool { Name = "give_item" } } });
                    Envelope sent = ReceiveSkippingHeartbeats(router, signer, out identity);
                    Check.Equal(CreateSessionRequest.TypeName, sent.Message.Type, "the valid request");
                    Check.Equal(1, ((CreateSessionRequest)sent.Message).Tools.Count, "its one tool");
                    router.Send(identity, Reply(sent, new CreateSessionReply { SessionId = "s1" }, signer));
                    Check.Equal("s1", IgiClient.Wait(created), "answered");
                }
            });
            t.Add("client:dispose_fails_requests_in_flight", () =>
            {
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    Task<IgiClient> connecting = IgiClient.ConnectAsync(InfoFor(router));
                    byte[] identity;
                    Envelope hello = ReceiveRequest(router, signer, out identity);
                    router.Send(identity, Reply(hello, GoodHello(), signer));
                    IgiClient client = IgiClient.Wait(connecting);
                    Task<StatusReply> status = client.StatusAsync();
                    ReceiveRequest(router, signer, out identity);
                    client.Dispose();
                    Check.Throws<IgiClientClosedException>(() => IgiClient.Wait(status), "status after close");
                    Check.True(!client.IsDaemonAlive, "closed client reports not alive");
                    Check.Throws<IgiClientClosedException>(() => IgiClient.Wait(client.StatusAsync()), "new request after close");
                }
            });
            if (Ipv6LoopbackAvailable())
                t.Add("client:connects_over_ipv6_loopback", () =>
                {
                    var signer = Signer.FromHex(KeyHex);
                    using (var router = new TestRouter("::1"))
                    {
                        byte[] identity;
                        using (IgiClient client = ConnectTo(router, signer, out identity, ip: "::1"))
                        {
                            Check.Equal("tcp://[::1]:" + router.Port, client.Connection.Endpoint, "bracketed endpoint");
                            Check.Equal("test", client.Hello.DaemonVersion, "handshake over tcp://[::1]");
                        }
                    }
                });
            else t.Skip("client:connects_over_ipv6_loopback", "this host cannot bind tcp://[::1]");
        }

        private static bool Ipv6LoopbackAvailable()
        {
            try { using (new TestRouter("::1")) return true; }
            catch (IgiTransportException) { return false; }
        }
    }
}
