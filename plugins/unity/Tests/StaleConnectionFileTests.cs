// A connection file left by a daemon that is gone (killed with SIGKILL): pid_start_ticks is read, the liveness check
// tells a dead or reused pid from a live one, and IgiClient.Connect(path) fails fast with a typed error instead of
// waiting out HelloTimeoutS, while a daemon that answers is still used.
using System;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Runtime.InteropServices;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Tests
{
    public static class StaleConnectionFileTests
    {
        private const string KeyHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

        [DllImport("libc", EntryPoint = "chmod", SetLastError = true)]
        private static extern int chmod([MarshalAs(UnmanagedType.LPStr)] string path, uint mode);

        private static string FileText(int port, int pid, string startTicks)
        {
            return "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": " + port + ", \"key\": \"" + KeyHex + "\", " +
                   "\"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.2\", \"pid\": " + pid + ", " +
                   "\"zmq_mechanism\": \"null\"" + (startTicks != null ? ", \"pid_start_ticks\": " + startTicks : "") + "}";
        }

        private static string WriteFile(int port, int pid, string startTicks)
        {
            string path = Path.Combine(Path.GetTempPath(), "igi-stale-" + Guid.NewGuid().ToString("N") + ".json");
            File.WriteAllText(path, FileText(port, pid, startTicks));
            Check.Equal(0, chmod(path, Convert.ToUInt32("600", 8)), "chmod 600 " + path);
            return path;
        }

        private static int ClosedPort()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            int port = ((IPEndPoint)listener.LocalEndpoint).Port;
            listener.Stop();
            return port;
        }

        private static int NoSuchPid()
        {
            return int.Parse(File.ReadAllText("/proc/sys/kernel/pid_max").Trim()) + 1;  // above pid_max: never a process
        }

        public static void Register(TestRunner t)
        {
            t.Add("connection_file:pid_start_ticks_is_optional_and_checked", () =>
            {
                Check.Equal(8123456L, ConnectionInfo.Parse(FileText(5555, 42, "8123456")).PidStartTicks.Value, "read");
                Check.True(ConnectionInfo.Parse(FileText(5555, 42, null)).PidStartTicks == null, "absent: null");
                Check.True(ConnectionInfo.Parse(FileText(5555, 42, "null")).PidStartTicks == null, "null");
                foreach (string bad in new[] { "-1", "\"8123456\"", "1.5", "true" })
                    Check.Throws<IgiConnectionFileException>(() => ConnectionInfo.Parse(FileText(5555, 42, bad)), "refused: " + bad);
            });
            if (!File.Exists("/proc/self/stat"))
            {
                t.Skip("client:stale_connection_file_fails_after_a_short_handshake", "no /proc: pids are checked without start times");
                return;
            }
            t.Add("process_liveness:dead_and_reused_pids_are_gone", () =>
            {
                int me = Process.GetCurrentProcess().Id;
                long? start = ProcessLiveness.StartTicks(me);
                Check.True(start != null, "this process's start time is read");
                Check.Equal(true, ProcessLiveness.IsRunning(me, start), "this process, its start time");
                Check.Equal(true, ProcessLiveness.IsRunning(me, null), "this process, no start time recorded");
                Check.Equal(false, ProcessLiveness.IsRunning(me, start.Value + 1), "this pid, another start time: reused");
                Check.Equal(false, ProcessLiveness.IsRunning(NoSuchPid(), 1), "a pid no process has");
                Check.True(ProcessLiveness.IsRunning(0, null) == null, "0 is not a process id");
            });
            t.Add("client:stale_connection_file_fails_after_a_short_handshake", () =>
            {
                int me = Process.GetCurrentProcess().Id;
                long start = ProcessLiveness.StartTicks(me).Value;
                foreach (var gone in new[] { new[] { NoSuchPid(), 1L }, new[] { me, start + 1 } })
                {
                    string path = WriteFile(ClosedPort(), (int)gone[0], gone[1].ToString());
                    try
                    {
                        var options = new IgiClientOptions { HelloTimeoutS = 15, StaleHelloTimeoutS = 0.3 };
                        var sw = Stopwatch.StartNew();
                        var e = Check.Throws<IgiStaleConnectionFileException>(() => IgiClient.Connect(path, options), "pid " + gone[0]);
                        Check.True(sw.Elapsed.TotalSeconds < options.HelloTimeoutS / 2, "failed fast: " + sw.Elapsed.TotalSeconds + " s");
                        Check.Equal((int)gone[0], e.Pid, "the pid");
                        Check.Equal(path, e.Path, "the file");
                        Check.True(e is IgiConnectionFileException, "an IgiConnectionFileException");
                        Check.True(e.Message.Contains("no longer running"), e.Message);
                    }
                    finally
                    {
                        File.Delete(path);
                    }
                }
            });
            t.Add("client:a_gone_pid_whose_daemon_answers_is_used", () =>
            {
                // the pid may be of another pid namespace (a daemon in a container): the short handshake decides
                var signer = Signer.FromHex(KeyHex);
                using (var router = new TestRouter())
                {
                    string path = WriteFile(router.Port, NoSuchPid(), "1");
                    try
                    {
                        Task<IgiClient> connecting = IgiClient.ConnectAsync(path, new IgiClientOptions { StaleHelloTimeoutS = 5 });
                        var frames = router.Receive(10000);
                        Check.True(frames != null, "hello received");
                        byte[] identity = frames[0];
                        Envelope hello = WireCodec.Decode(frames.GetRange(1, frames.Count - 1), signer);
                        var reply = new HelloReply { DaemonVersion = "test", ProtocolVersion = "1.2", HeartbeatIntervalS = 60, ClientTimeoutS = 10, Limits = new Limits() };
                        router.Send(identity, WireCodec.Encode(Header.New(reply.Type, null, hello.Header.MsgId), reply, signer));
                        using (IgiClient client = IgiClient.Wait(connecting))
                            Check.Equal("test", client.Hello.DaemonVersion, "connected");
                    }
                    finally
                    {
                        File.Delete(path);
                    }
                }
            });
        }
    }
}
