// Live tests against a running daemon (real model, real sockets), given its connection file.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text.RegularExpressions;
using System.Threading;
using Igi.Budget;
using Igi.Client;
using Igi.MsgPack;
using Igi.Protocol;

namespace Igi.Tests
{
    public static class LiveTests
    {
        private const double WaitS = 180.0;

        /// <summary>A request type no protocol version defines.</summary>
        private sealed class FrobnicateRequest : IgiRequest
        {
            public override string Type { get { return "frobnicate_request"; } }
            public override string ReplyType { get { return "frobnicate_reply"; } }
            public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
        }

        private static void PumpUntil(IgiClient client, Func<bool> done, string what)
        {
            var sw = Stopwatch.StartNew();
            while (!done())
            {
                client.Pump();
                if (sw.Elapsed.TotalSeconds > WaitS) throw new AssertionException("gave up waiting for " + what + " after " + WaitS + " s");
                Thread.Sleep(5);
            }
            client.Pump();
        }

        private sealed class Stream
        {
            public readonly List<TokenEvent> Tokens = new List<TokenEvent>();
            public GenerateReply Reply;
            public IgiException Error;
            public bool Finished { get { return Reply != null || Error != null; } }
        }

        private static Stream Run(IgiClient client, string session, string text, long maxTokens, Action<Stream, GenerateHandle> onFirstToken = null)
        {
            var s = new Stream();
            GenerateHandle handle = null;
            handle = client.Generate(session, text,
                tok => { s.Tokens.Add(tok); if (s.Tokens.Count == 1 && onFirstToken != null) onFirstToken(s, handle); },
                reply => s.Reply = reply, err => s.Error = err, maxTokens: maxTokens);
            PumpUntil(client, () => s.Finished, "generation of '" + text + "'");
            return s;
        }

        private static void CheckStream(Stream s, string what)
        {
            if (s.Error != null) throw new AssertionException(what + ": generation failed: " + s.Error.Message);
            var concatenated = new System.Text.StringBuilder();
            for (int i = 0; i < s.Tokens.Count; i++)
            {
                Check.Equal((long)i, s.Tokens[i].Index, what + ": token index");
                concatenated.Append(s.Tokens[i].Text);
            }
            Check.Equal(s.Reply.Text, concatenated.ToString(), what + ": reply text = concatenated tokens");
            Check.Equal((long)s.Tokens.Count, s.Reply.Usage.CompletionTokens, what + ": usage.completion_tokens");
        }

        public static void Register(TestRunner t, string connectionFile)
        {
            Func<IgiClient> connect = () => IgiClient.Connect(connectionFile, new IgiClientOptions { ClientName = "unity-plugin-tests" });
            var greedy = Sampling.Greedy(24);
            const string system = "You are Mira, a blacksmith in a small village. Answer in one short sentence.";

            t.Add("live:handshake", () =>
            {
                using (IgiClient client = connect())
                {
                    Check.True(Regex.IsMatch(client.Hello.ProtocolVersion, "\\A1\\.[0-9]+\\z"), "protocol 1.x, got " + client.Hello.ProtocolVersion);
                    Check.True(client.Hello.HeartbeatIntervalS > 0, "heartbeat interval announced");
                    Check.True(client.Hello.Limits.MaxFrameBytes >= 1024, "limits announced");
                    Check.True(client.IsDaemonAlive, "alive");
                }
            });
            t.Add("live:a_peer_without_the_handshake_credential_is_not_answered", () =>
            {
                // PROTOCOL.md 1.5: what a client older than 1.2 sees. Its hello carries the right HMAC, but without the
                // PLAIN credential the daemon's socket never completes its handshake, so nothing is read or answered.
                ConnectionInfo info = ConnectionInfo.Load(connectionFile);
                Check.Equal("plain", info.ZmqMechanism, "the daemon authenticates at the handshake by default");
                using (var transport = new Igi.Transport.ZmqDealerTransport())
                {
                    transport.Connect(info.Endpoint);
                    var hello = new HelloRequest { ClientName = "no-credential" };
                    try { transport.Send(WireCodec.Encode(Header.New(hello.Type), hello, Signer.FromHex(info.KeyHex))); }
                    catch (IgiTransportException) { }  // nothing to queue it on: refused outright
                    byte[][] frames;
                    Check.True(!transport.TryReceive(1500, out frames), "no reply without the credential");
                }
                using (IgiClient client = connect())
                    Check.True(client.IsDaemonAlive, "a client with the credential is served");
            });
            t.Add("live:status", () =>
            {
                using (IgiClient client = connect())
                {
                    StatusReply status = IgiClient.Wait(client.StatusAsync());
                    Check.True(status.Model != null, "a model is loaded");
                    Check.True(status.Model.NLayer > 0, "model has layers");
                    Check.True(status.UptimeS > 0, "uptime");
                }
            });
            t.Add("live:create_and_close_session", () =>
            {
                using (IgiClient client = connect())
                {
                    string session = IgiClient.Wait(client.CreateSessionAsync("Mira", system, greedy));
                    Check.True(Regex.IsMatch(session, "\\A[A-Za-z0-9_-]{1,64}\\z"), "session id shape: " + session);
                    Check.True(IgiClient.Wait(client.StatusAsync()).NSessions >= 1, "status counts the session");
                    IgiClient.Wait(client.CloseSessionAsync(session));
                    Check.Throws<IgiNotFoundException>(() => IgiClient.Wait(client.CloseSessionAsync(session)), "closing twice");
                }
            });
            t.Add("live:generate_streams_greedy_tokens", () =>
            {
                using (IgiClient client = connect())
                {
                    string a = IgiClient.Wait(client.CreateSessionAsync("Mira", system, greedy));
                    string b = IgiClient.Wait(client.CreateSessionAsync("Mira", system, greedy));
                    Stream first = Run(client, a, "What do you sell?", 8);
                    CheckStream(first, "first");
                    Check.True(first.Tokens.Count > 0, "at least one token");
                    Check.True(first.Reply.FinishReason == "stop" || first.Reply.FinishReason == "length", "finish_reason " + first.Reply.FinishReason);
                    Check.True(first.Reply.Text.Trim().Length > 0, "non-empty text");
                    Stream second = Run(client, b, "What do you sell?", 8);
                    CheckStream(second, "second");
                    Check.Equal(first.Reply.Text, second.Reply.Text, "greedy decoding is deterministic across sessions");
                    IgiClient.Wait(client.CloseSessionAsync(a));
                    IgiClient.Wait(client.CloseSessionAsync(b));
                }
            });
            t.Add("live:cancel_mid_stream", () =>
            {
                using (IgiClient client = connect())
                {
                    string session = IgiClient.Wait(client.CreateSessionAsync("Mira", system, Sampling.Greedy(256)));
                    CancelReply cancelReply = null;
                    Stream s = Run(client, session, "Tell me a very long story about your forge.", 256,
                        (stream, handle) => handle.Cancel().ContinueWith(task => cancelReply = task.Result));
                    CheckStream(s, "cancelled");
                    Check.Equal("cancelled", s.Reply.FinishReason, "finish_reason");
                    Check.True(s.Tokens.Count < 256, "stopped before max_tokens");
                    PumpUntil(client, () => cancelReply != null, "cancel_reply");
                    Check.True(cancelReply.Cancelled, "cancel_reply.cancelled");
                    IgiClient.Wait(client.CloseSessionAsync(session));
                }
            });
            t.Add("live:set_budget_gets_budget_ack", () =>
            {
                using (IgiClient client = connect())
                {
                    BudgetAck ack = IgiClient.Wait(client.SetBudgetAsync(0, "unity plugin test: CPU only"));
                    Check.Equal(0L, ack.RequestedMib, "requested_mib");
                    Check.Equal(0L, ack.GrantedMib, "granted_mib");
                    Check.True(ack.CpuFallback, "budget 0 runs on the CPU");
                    Check.True(ack.Plan != null && ack.Plan.Strategy.Length > 0, "plan strategy");
                }
            });
            t.Add("live:unknown_type_gets_error_reply", () =>
            {
                using (IgiClient client = connect())
                {
                    var e = Check.Throws<IgiUnknownTypeRemoteException>(() => IgiClient.Wait(client.SendAsync(new FrobnicateRequest(), null, 30)), "frobnicate");
                    Check.Equal("unknown_type", e.Code, "code");
                    Check.True(client.IsDaemonAlive, "still connected");
                    Check.True(IgiClient.Wait(client.StatusAsync()) != null, "daemon still answers");
                }
            });
            t.Add("live:invalid_value_gets_invalid_request", () =>
            {
                using (IgiClient client = connect())
                {
                    Check.Throws<IgiInvalidRequestException>(() => IgiClient.Wait(client.SetBudgetAsync(-1)), "negative budget");
                    Check.Throws<IgiNotFoundException>(() => IgiClient.Wait(client.CloseSessionAsync("no_such_session")), "unknown session");
                    // a session id the daemon could not answer by msg_id is refused before sending (it would time out)
                    Check.Throws<IgiProtocolException>(() => IgiClient.Wait(client.CloseSessionAsync("has space")), "malformed session id");
                    Check.Throws<IgiProtocolException>(() => client.Generate(new string('a', 65), "hi", null, null, null), "session id too long");
                    Check.Throws<IgiProtocolException>(() => IgiClient.Wait(client.SetBudgetAsync(0, "\ud800")), "lone surrogate in text");
                    IgiException error = null;
                    client.Generate("no_such_session", "hi", null, null, e => error = e);
                    PumpUntil(client, () => error != null, "onError");
                    Check.True(error is IgiNotFoundException, "generate on unknown session: " + error.GetType().Name);
                }
            });
            // What the real governor answers depends on its state (a first sample is still in warm-up), so this checks the
            // report round trip only; applying a given throttle is client:frame_budget_helper_applies_the_daemon_throttle.
            t.Add("live:frame_budget_helper_report_gets_a_reply", () =>
            {
                using (IgiClient client = connect())
                {
                    var helper = new FrameBudgetHelper(client, 1000.0 / 60.0, 0.1);
                    int sent = 0;
                    for (int frame = 0; frame < 6; frame++) sent += helper.AddFrame(0.020) ? 1 : 0;
                    Check.Equal(1, sent, "one report after 0.1 s of frames");
                    Check.True(Math.Abs(helper.LastReport.P95Ms - 20.0) < 1e-9, "p95 of 20 ms frames");
                    IgiException failure = null;
                    helper.Failed += e => failure = e;
                    PumpUntil(client, () => helper.RepliesReceived > 0 || failure != null, "frame_stats_reply");
                    Check.True(failure == null, "no failure: " + (failure == null ? "" : failure.Message));
                    Check.Equal(1, helper.RepliesReceived, "the daemon answered the report");
                    long? cap = helper.Throttle.TokensPerFrame;
                    Check.True(cap == null || cap.Value >= 1, "tokens_per_frame nil or >= 1, got " + cap);
                    Check.True(helper.Throttle.SleepMsBetweenTokens >= 0, "sleep_ms_between_tokens >= 0");
                    Check.True(helper.ProposedBudgetMib == null || helper.ProposedBudgetMib.Value >= 0, "proposed budget nil or >= 0");
                }
            });
        }
    }
}
