// IgiClient receive-path behaviour against a raw ROUTER socket (forged signatures, error mapping, timeouts, close),
// and FrameBudgetHelper applying a scripted frame_stats_reply.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Igi.Budget;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Tests
{
    public static class ClientUnitTests
    {
        private const string KeyHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

        private static ConnectionInfo InfoFor(TestRouter router)
        {
            return ConnectionInfo.Parse("{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": " + router.Port +
                                        ", \"key\": \"" + KeyHex + "\", \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 1}");
        }

        private static Envelope ReceiveRequest(TestRouter router, Signer signer, out byte[] identity)
        {
            List<byte[]> frames = router.Receive(10000);
            Check.True(frames != null, "the router received a request");
            identity = frames[0];
            return WireCodec.Decode(frames.GetRange(1, frames.Count - 1), signer);
        }

        private static byte[][] Reply(Envelope request, IgiMessage reply, Signer signer)
        {
            return WireCodec.Encode(Header.New(reply.Type, request.Header.SessionId, request.Header.MsgId), reply, signer);
        }

        private static HelloReply GoodHello()
        {
            return new HelloReply { DaemonVersion = "test", ProtocolVersion = "1.0", HeartbeatIntervalS = 0, ClientTimeoutS = 10, Limits = new Limits() };
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
                        Check.Equal(3, helper.PumpBudget, "pump budget = tokens_per_frame + the terminal callback");
                        Check.Equal(1, changes.Count, "ThrottleChanged raised for the new throttle");
                        Check.Equal((long?)2, changes[0].TokensPerFrame, "ThrottleChanged carries the new throttle");
                        Check.Equal((long?)768, helper.ProposedBudgetMib, "proposed budget kept");
                        Check.Equal("768", string.Join(",", proposals), "BudgetProposed raised once with the proposal");

                        round(new FrameStatsReply { Throttle = new Throttle { TokensPerFrame = 2, SleepMsBetweenTokens = 50 } }, "same throttle");
                        Check.Equal(1, changes.Count, "ThrottleChanged not raised when the throttle is unchanged");
                        Check.Equal(3, helper.PumpBudget, "pump budget unchanged");
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
        }
    }
}
