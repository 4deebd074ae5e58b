// Tests of the libzmq DEALER transport against a real ROUTER socket over loopback TCP.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using System.Threading;
using Igi.Transport;

namespace Igi.Tests
{
    public static class TransportTests
    {
        public static void Register(TestRunner t)
        {
            t.Add("transport:libzmq_loads", () =>
            {
                string v = ZmqDealerTransport.LibraryVersion();
                Check.True(v.StartsWith("4."), "libzmq 4.x, got " + v);
            });
            t.Add("transport:dealer_router_multipart_round_trip", () =>
            {
                using (var router = new TestRouter())
                using (var dealer = new ZmqDealerTransport())
                {
                    dealer.Connect(router.Endpoint);
                    var sent = new List<byte[]> { Encoding.ASCII.GetBytes("IGI1"), new byte[0], new byte[100000], new byte[] { 0xc0 } };
                    dealer.Send(sent);
                    List<byte[]> got = router.Receive(5000);
                    Check.True(got != null, "router received");
                    Check.Equal(5, got.Count, "identity + 4 frames");
                    for (int i = 0; i < 4; i++) Check.BytesEqual(sent[i], got[i + 1], "frame " + i);
                    router.Send(got[0], new List<byte[]> { Encoding.ASCII.GetBytes("a"), Encoding.ASCII.GetBytes("bc") });
                    byte[][] reply;
                    bool ok = false;
                    for (int i = 0; i < 50 && !ok; i++) ok = dealer.TryReceive(100, out reply) && reply.Length == 2 && reply[1].Length == 2;
                    Check.True(ok, "dealer received the 2-frame reply");
                }
            });
            t.Add("transport:receive_times_out_without_traffic", () =>
            {
                using (var router = new TestRouter())
                using (var dealer = new ZmqDealerTransport())
                {
                    dealer.Connect(router.Endpoint);
                    byte[][] frames;
                    Check.True(!dealer.TryReceive(20, out frames), "no message");
                    Check.True(frames == null, "frames null on timeout");
                }
            });
            t.Add("transport:wake_interrupts_a_blocking_receive", () =>
            {
                using (var router = new TestRouter())
                using (var dealer = new ZmqDealerTransport())
                {
                    dealer.Connect(router.Endpoint);
                    var waker = new Thread(() => { Thread.Sleep(50); dealer.Wake(); });
                    var sw = Stopwatch.StartNew();
                    waker.Start();
                    byte[][] frames;
                    // Without a working Wake() this receive would block for its full 10 s timeout.
                    bool got = dealer.TryReceive(10000, out frames);
                    double elapsedS = sw.Elapsed.TotalSeconds;
                    waker.Join();
                    Check.True(!got, "woken without a message");
                    Check.True(frames == null, "no frames on a wake-up");
                    Check.True(elapsedS < 2.0, "Wake() ended the 10 s receive early, after " + elapsedS.ToString("F3") + " s");
                }
            });
            t.Add("transport:max_message_bytes_caps_inbound_frames", () =>
            {
                // PROTOCOL.md 1.4: ZMQ_MAXMSGSIZE is a hard cap. A frame over it is a protocol error for libzmq, which drops
                // the connection and, for a protocol error, does not re-establish it: the frame never reaches TryReceive
                // and the DEALER has no peer left (a send fails at once with EAGAIN).
                using (var dealer = new ZmqDealerTransport())
                    Check.Equal(2L * Igi.Protocol.WireCodec.DefaultMaxFrameBytes, dealer.MaxMessageBytes, "default cap: 2 x the default max_frame_bytes");
                Check.Equal(2L * 1048576, ZmqDealerTransport.DefaultMaxMessageBytes, "DefaultMaxMessageBytes");
                foreach (long cap in new[] { 4096L, ZmqDealerTransport.DefaultMaxMessageBytes })
                {
                    using (var router = new TestRouter())
                    using (var dealer = new ZmqDealerTransport())
                    {
                        if (cap != ZmqDealerTransport.DefaultMaxMessageBytes) dealer.MaxMessageBytes = cap;
                        dealer.Connect(router.Endpoint);
                        Check.Throws<InvalidOperationException>(() => dealer.MaxMessageBytes = 1024, "cap " + cap + ": set after Connect");
                        Check.Equal(cap, dealer.MaxMessageBytes, "cap " + cap + ": unchanged by the refused set");
                        byte[] identity = RoundTrip(router, dealer, new byte[cap], "cap " + cap + ": a frame of exactly the cap");
                        router.Send(identity, new List<byte[]> { new byte[cap + 1] });
                        router.Send(identity, new List<byte[]> { new byte[] { 1 } });
                        byte[][] frames;
                        Check.True(!dealer.TryReceive(500, out frames), "cap " + cap + ": a frame one byte over the cap is not delivered (nor what follows)");
                        Check.Throws<IgiTransportException>(() => dealer.Send(new List<byte[]> { Encoding.ASCII.GetBytes("ping") }),
                                                            "cap " + cap + ": the connection was dropped, not re-established");
                    }
                }
            });
            t.Add("transport:only_the_plain_credential_passes_a_plain_server", () =>
            {
                // PROTOCOL.md 1.5: the daemon's socket is a ZMQ_PLAIN server; a peer without the credential, or with
                // another one, is refused at the handshake and none of its frames reaches the socket.
                byte[] password = Encoding.ASCII.GetBytes(new string('a', 64));
                using (var router = new TestRouter(plainPassword: password))
                {
                    using (var good = new ZmqDealerTransport())
                    {
                        good.SetPlainCredential("igi", password);
                        good.Connect(router.Endpoint);
                        Check.Throws<InvalidOperationException>(() => good.SetPlainCredential("igi", password), "set after Connect");
                        RoundTrip(router, good, Encoding.ASCII.GetBytes("in"), "the right credential");
                    }
                    foreach (byte[] wrong in new[] { Encoding.ASCII.GetBytes(new string('b', 64)), null })
                        using (var peer = new ZmqDealerTransport())
                        {
                            if (wrong != null) peer.SetPlainCredential("igi", wrong);
                            peer.Connect(router.Endpoint);
                            try { peer.Send(new List<byte[]> { Encoding.ASCII.GetBytes("out") }); }
                            catch (IgiTransportException) { }  // no connection to queue it on: refused outright
                            Check.True(router.Receive(500) == null, (wrong == null ? "no credential" : "a wrong password") + ": nothing received");
                        }
                    Check.Equal(1, router.ZapAccepted, "one accepted");
                    Check.True(router.ZapRefused >= 1, "the wrong password was refused by the ZAP handler");
                }
                using (var dealer = new ZmqDealerTransport())
                    Check.Throws<ArgumentException>(() => dealer.SetPlainCredential("igi", new byte[0]), "an empty password");
            });
            t.Add("transport:connect_refuses_bad_endpoint", () =>
            {
                using (var dealer = new ZmqDealerTransport())
                {
                    var e = Check.Throws<IgiTransportException>(() => dealer.Connect("bogus://nowhere"), "bad endpoint");
                    Check.True(e.Errno != 0, "errno set");
                }
            });
            t.Add("transport:dispose_is_idempotent_and_final", () =>
            {
                var dealer = new ZmqDealerTransport();
                dealer.Dispose();
                dealer.Dispose();
                dealer.Wake();
                Check.Throws<ObjectDisposedException>(() => dealer.Connect("tcp://127.0.0.1:1"), "use after dispose");
            });
        }

        // The dealer sends one frame; the router answers `reply` to the identity it came from. Returns that identity.
        private static byte[] RoundTrip(TestRouter router, ZmqDealerTransport dealer, byte[] reply, string what)
        {
            dealer.Send(new List<byte[]> { Encoding.ASCII.GetBytes("ping") });
            List<byte[]> got = router.Receive(5000);
            Check.True(got != null, what + ": router received the ping");
            router.Send(got[0], new List<byte[]> { reply });
            byte[][] frames = null;
            bool ok = false;
            for (int i = 0; i < 50 && !ok; i++) ok = dealer.TryReceive(100, out frames);
            Check.True(ok && frames.Length == 1 && frames[0].Length == reply.Length, what + ": the dealer received the " + reply.Length + "-byte frame");
            return got[0];
        }
    }
}
