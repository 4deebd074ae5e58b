// Layer: core/launcher. Starts the self-contained daemon bundle, waits for its connection file, restarts it with
// backoff when it dies, stops it on request. No UnityEngine: IgiDaemonLauncher (Runtime/Unity) drives it.
using System;
using System.Collections.Concurrent;
using System.Diagnostics;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Launcher
{
    /// <summary>
    /// Supervises one daemon process at a time. A background thread starts it (<c>--connection-file F --port 0</c>,
    /// <c>--exit-with-pid</c> of this process unless <see cref="DaemonLauncherOptions.ExitWithGame"/> is false, then
    /// <see cref="DaemonLauncherOptions.Arguments"/>), deletes a stale connection file first, and waits until the
    /// file names the new process's pid; it then watches the process and, when it dies without being asked to, starts
    /// it again after <see cref="RestartBackoff"/>'s delay. Events (<see cref="Ready"/>, <see cref="Exited"/>,
    /// <see cref="Failed"/>, <see cref="Log"/>) are queued and run only inside <see cref="Pump"/>, on the thread that
    /// calls it (in Unity, the main thread). The daemon's stdout and stderr (its log) come back as <see cref="Log"/> lines.
    /// </summary>
    public sealed class DaemonLauncher : IDisposable
    {
        private const int PollMs = 20;
        private static readonly int OwnPid = CurrentProcessId();
        private readonly DaemonLauncherOptions _options;
        private readonly CallbackQueue _events = new CallbackQueue();
        private readonly ManualResetEvent _wake = new ManualResetEvent(false);
        private readonly object _lock = new object();
        private Thread _supervisor;
        private Process _process;
        private volatile bool _stopping;
        private volatile DaemonState _state = DaemonState.Stopped;
        private ConnectionInfo _connection;
        private int _restarts;

        /// <summary>A launcher with these options (checked here); nothing starts before <see cref="Start"/>.</summary>
        public DaemonLauncher(DaemonLauncherOptions options)
        {
            if (options == null) throw new ArgumentNullException("options");
            options.Validate();
            _options = options;
        }

        /// <summary>A daemon is ready: its connection file is there (first start and each restart).</summary>
        public event Action<DaemonReadyEventArgs> Ready;

        /// <summary>The daemon died without being asked to stop (a restart follows unless RestartInS &lt; 0).</summary>
        public event Action<DaemonExitedEventArgs> Exited;

        /// <summary>The launcher gave up (the message says why); <see cref="State"/> is <see cref="DaemonState.Failed"/>.</summary>
        public event Action<string> Failed;

        /// <summary>A line of the daemon's output, or of the launcher's own account of starts and deaths.</summary>
        public event Action<DaemonLogLine> Log;

        /// <summary>Raised (on the pumping thread) when an event handler throws; the pump goes on.</summary>
        public event Action<Exception> HandlerFailed
        {
            add { _events.CallbackFailed += value; }
            remove { _events.CallbackFailed -= value; }
        }

        /// <summary>The options in use.</summary>
        public DaemonLauncherOptions Options { get { return _options; } }

        /// <summary>Where the launcher stands (read from any thread).</summary>
        public DaemonState State { get { return _state; } }

        /// <summary>The running daemon's connection, null unless <see cref="State"/> is Running.</summary>
        public ConnectionInfo Connection { get { lock (_lock) return _state == DaemonState.Running ? _connection : null; } }

        /// <summary>The current daemon's process id, or 0.</summary>
        public int Pid
        {
            get
            {
                lock (_lock)
                {
                    try { return _process != null && !_process.HasExited ? _process.Id : 0; }
                    catch (InvalidOperationException) { return 0; }
                }
            }
        }

        /// <summary>Restarts so far.</summary>
        public int Restarts { get { return Volatile.Read(ref _restarts); } }

        /// <summary>Events waiting for <see cref="Pump"/>.</summary>
        public int QueuedEvents { get { return _events.Count; } }

        /// <summary>Runs up to <paramref name="max"/> queued events on the calling thread; returns how many ran.</summary>
        public int Pump(int max = int.MaxValue) { return _events.Pump(max); }

        /// <summary>Starts the supervising thread (once; later calls do nothing while it runs).</summary>
        public void Start()
        {
            lock (_lock)
            {
                if (_supervisor != null) return;
                _stopping = false;
                _wake.Reset();
                _state = DaemonState.Starting;
                _supervisor = new Thread(Supervise) { IsBackground = true, Name = "igi-daemon-launcher" };
                _supervisor.Start();
            }
        }

        /// <summary>Blocks until the daemon is Running (true), the launcher Failed or Stopped (false), or the timeout.
        /// Events still run only in <see cref="Pump"/>.</summary>
        public bool WaitUntilRunning(double timeoutS)
        {
            var sw = Stopwatch.StartNew();
            while (sw.Elapsed.TotalSeconds < timeoutS)
            {
                DaemonState s = _state;
                if (s == DaemonState.Running) return true;
                if (s == DaemonState.Failed || (s == DaemonState.Stopped && _supervisor == null)) return false;
                Thread.Sleep(PollMs);
            }
            return _state == DaemonState.Running;
        }

        /// <summary>
        /// Stops supervising and ends the daemon: a <c>shutdown_request</c> through <paramref name="client"/> when it is
        /// connected to this daemon (the daemon answers what is waiting, removes its connection file and exits), else
        /// SIGTERM (POSIX) or nothing (Windows); after <see cref="DaemonLauncherOptions.StopTimeoutS"/> it is killed.
        /// Returns once the process has exited. Safe to call more than once and from any thread.
        /// </summary>
        public void Stop(IgiClient client = null)
        {
            Thread supervisor;
            Process process;
            lock (_lock)
            {
                _stopping = true;
                _wake.Set();
                supervisor = _supervisor;
                process = _process;
            }
            if (process != null && !HasExited(process))
            {
                bool asked = false;
                if (client != null && client.IsDaemonAlive && client.Connection != null && client.Connection.Pid == SafeId(process))
                {
                    try
                    {
                        // answered in time: the daemon is exiting, and the wait below gives it StopTimeoutS; unanswered, it
                        // is signalled (or, without a signal, killed) at once rather than after a second StopTimeoutS
                        asked = client.SendAsync(new ShutdownRequest(), null, Math.Max(1.0, _options.StopTimeoutS)).Wait(TimeSpan.FromSeconds(Math.Max(1.0, _options.StopTimeoutS)));
                    }
                    catch (AggregateException) { }  // the daemon may exit before its reply arrives: the wait below decides
                    catch (IgiException) { }  // refused unsent (the client closed or declared the daemon gone meanwhile)
                }
                bool signalled = asked || Terminate(process);
                if (!signalled || !process.WaitForExit((int)(_options.StopTimeoutS * 1000)))
                {
                    if (signalled) Say("warning", "the daemon (pid " + SafeId(process) + ") did not exit within " + _options.StopTimeoutS + " s: killing it");
                    try { process.Kill(); } catch (InvalidOperationException) { } catch (System.ComponentModel.Win32Exception) { }
                    process.WaitForExit(5000);
                }
            }
            if (supervisor != null && supervisor != Thread.CurrentThread) supervisor.Join(10000);
            lock (_lock)
            {
                if (_supervisor == supervisor) _supervisor = null;
                _state = DaemonState.Stopped;
                _connection = null;
            }
            RemoveStaleConnectionFile(process);
        }

        /// <summary>Same as <see cref="Stop"/> without a client.</summary>
        public void Dispose() { Stop(); }

        // ----- the supervising thread -----

        private void Supervise()
        {
            int failures = 0;
            double diedAtS = -1;
            var clock = Stopwatch.StartNew();
            try
            {
                while (!_stopping)
                {
                    _state = DaemonState.Starting;
                    Process process = null;
                    double startedAtS = clock.Elapsed.TotalSeconds;
                    bool ready = false;
                    string why;
                    try
                    {
                        DeleteConnectionFile();
                        process = Launch();
                        why = WaitForConnectionFile(process, clock, startedAtS, diedAtS, ref ready);
                    }
                    catch (Exception e) when (e is System.ComponentModel.Win32Exception || e is IOException ||
                                              e is InvalidOperationException || e is UnauthorizedAccessException)
                    {
                        why = "cannot start " + _options.ExecutablePath + ": " + e.Message;
                    }
                    if (_stopping) break;
                    if (ready)
                    {
                        // HasExited, not WaitForExit(): that also waits for the end of the output pipes, which the
                        // daemon's worker holds until it notices its parent is gone (a second or more).
                        while (!_stopping && !HasExited(process)) Thread.Sleep(PollMs);
                        if (_stopping) break;
                        why = "exited with code " + process.ExitCode;
                    }
                    double uptimeS = clock.Elapsed.TotalSeconds - startedAtS;
                    diedAtS = clock.Elapsed.TotalSeconds;
                    lock (_lock) _connection = null;
                    failures = ready && uptimeS >= _options.StableUptimeS ? 1 : failures + 1;
                    bool giveUp = failures > _options.MaxConsecutiveFailures;
                    double delayS = giveUp ? -1 : RestartBackoff.DelayS(failures, _options.RestartDelayS, _options.MaxRestartDelayS);
                    var exited = new DaemonExitedEventArgs
                    {
                        Pid = process != null ? SafeId(process) : 0,
                        ExitCode = process != null && HasExited(process) ? process.ExitCode : -1,
                        UptimeS = uptimeS, WasReady = ready, RestartInS = delayS,
                    };
                    Say(giveUp ? "error" : "warning", "daemon " + (exited.Pid != 0 ? "pid " + exited.Pid + " " : "") + why +
                        " after " + uptimeS.ToString("F1") + " s" + (giveUp ? "; " + failures + " failures in a row: giving up"
                        : "; restarting in " + delayS.ToString("F2") + " s"));
                    Post(() => { var h = Exited; if (h != null) h(exited); });
                    if (giveUp)
                    {
                        _state = DaemonState.Failed;
                        string message = "the daemon failed " + failures + " times in a row (last: " + why + ")";
                        Post(() => { var h = Failed; if (h != null) h(message); });
                        return;
                    }
                    _state = DaemonState.Backoff;
                    if (_wake.WaitOne(TimeSpan.FromSeconds(delayS))) break;  // Stop() during the delay
                    Interlocked.Increment(ref _restarts);
                }
            }
            finally
            {
                if (_state != DaemonState.Failed) _state = _stopping ? DaemonState.Stopped : _state;
            }
        }

        private string WaitForConnectionFile(Process process, Stopwatch clock, double startedAtS, double diedAtS, ref bool ready)
        {
            int pid = SafeId(process);
            while (!_stopping)
            {
                if (HasExited(process))
                {
                    return "exited with code " + process.ExitCode + " before writing its connection file";
                }
                ConnectionInfo info = TryReadConnectionFile(pid);
                if (info != null)
                {
                    double nowS = clock.Elapsed.TotalSeconds;
                    var args = new DaemonReadyEventArgs
                    {
                        Connection = info, Pid = pid, Restart = Restarts, StartS = nowS - startedAtS,
                        DownS = diedAtS < 0 ? 0 : nowS - diedAtS,
                    };
                    lock (_lock) _connection = info;
                    _state = DaemonState.Running;
                    ready = true;
                    Say("info", "daemon pid " + pid + " ready in " + args.StartS.ToString("F2") + " s" +
                        (args.Restart > 0 ? " (restart " + args.Restart + ", down " + args.DownS.ToString("F2") + " s)" : ""));
                    Post(() => { var h = Ready; if (h != null) h(args); });
                    return null;
                }
                if (clock.Elapsed.TotalSeconds - startedAtS > _options.StartTimeoutS)
                {
                    try { process.Kill(); } catch (InvalidOperationException) { } catch (System.ComponentModel.Win32Exception) { }
                    process.WaitForExit(5000);
                    return "wrote no connection file within " + _options.StartTimeoutS + " s (killed)";
                }
                Thread.Sleep(PollMs);
            }
            return "stopped";
        }

        private ConnectionInfo TryReadConnectionFile(int pid)
        {
            if (!File.Exists(_options.ConnectionFile)) return null;
            try
            {
                ConnectionInfo info = ConnectionInfo.Load(_options.ConnectionFile);
                return info.Pid == pid ? info : null;
            }
            catch (IgiConnectionFileException) { return null; }  // being written (the daemon renames it into place)
            catch (IOException) { return null; }
        }

        private Process Launch()
        {
            var psi = new ProcessStartInfo
            {
                FileName = _options.ExecutablePath,
                Arguments = BuildArguments(),
                WorkingDirectory = _options.WorkingDirectory ?? (Path.GetDirectoryName(Path.GetFullPath(_options.ExecutablePath)) ?? "."),
                UseShellExecute = false,
                CreateNoWindow = true,
                RedirectStandardInput = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
                StandardOutputEncoding = Encoding.UTF8,
                StandardErrorEncoding = Encoding.UTF8,
            };
            // A frozen daemon needs no Python; a Python of the game's machine must not leak into it.
            foreach (string name in new[] { "PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE" }) psi.EnvironmentVariables.Remove(name);
            foreach (var kv in _options.Environment)
            {
                if (kv.Value == null) psi.EnvironmentVariables.Remove(kv.Key);
                else psi.EnvironmentVariables[kv.Key] = kv.Value;
            }
            var process = new Process { StartInfo = psi };
            process.OutputDataReceived += (s, e) => { if (e.Data != null) Forward(e.Data); };
            process.ErrorDataReceived += (s, e) => { if (e.Data != null) Forward(e.Data); };
            if (!process.Start()) throw new InvalidOperationException("Process.Start returned false");
            process.BeginOutputReadLine();
            process.BeginErrorReadLine();
            bool stopped;
            lock (_lock)
            {
                _process = process;
                stopped = _stopping;
            }
            if (stopped)
            {
                // Stop() ran while this process was being started and took no note of it: it has served nothing yet
                try { process.Kill(); } catch (InvalidOperationException) { } catch (System.ComponentModel.Win32Exception) { }
                process.WaitForExit(5000);
            }
            Say("info", "started " + psi.FileName + " " + psi.Arguments + " (pid " + process.Id + ")");
            return process;
        }

        private static int CurrentProcessId()
        {
            using (Process self = Process.GetCurrentProcess()) return self.Id;
        }

        private string BuildArguments()
        {
            var sb = new StringBuilder();
            sb.Append("--connection-file ").Append(QuoteArgument(_options.ConnectionFile)).Append(" --port 0");
            if (_options.ExitWithGame) sb.Append(" --exit-with-pid ").Append(OwnPid.ToString(System.Globalization.CultureInfo.InvariantCulture));
            foreach (string a in _options.Arguments) sb.Append(' ').Append(QuoteArgument(a));
            return sb.ToString();
        }

        /// <summary>One argument quoted for <see cref="ProcessStartInfo.Arguments"/> (the rules of the Windows C runtime,
        /// which Mono and .NET also apply on POSIX): plain when it has no space, tab or quote.</summary>
        public static string QuoteArgument(string arg)
        {
            if (arg == null) arg = "";
            if (arg.Length > 0 && arg.IndexOfAny(new[] { ' ', '\t', '\n', '"' }) < 0) return arg;
            var sb = new StringBuilder("\"");
            int backslashes = 0;
            foreach (char c in arg)
            {
                if (c == '\\') { backslashes++; continue; }
                if (c == '"') sb.Append('\\', backslashes * 2 + 1);
                else sb.Append('\\', backslashes);
                backslashes = 0;
                sb.Append(c);
            }
            sb.Append('\\', backslashes * 2).Append('"');
            return sb.ToString();
        }

        private void DeleteConnectionFile()
        {
            string dir = Path.GetDirectoryName(Path.GetFullPath(_options.ConnectionFile));
            if (!string.IsNullOrEmpty(dir)) Directory.CreateDirectory(dir);
            if (File.Exists(_options.ConnectionFile)) File.Delete(_options.ConnectionFile);  // a killed daemon's stale file
        }

        private void RemoveStaleConnectionFile(Process process)
        {
            if (process == null || !File.Exists(_options.ConnectionFile)) return;
            try
            {
                ConnectionInfo info = ConnectionInfo.Load(_options.ConnectionFile, checkPermissions: false);
                if (info.Pid == SafeId(process)) File.Delete(_options.ConnectionFile);
            }
            catch (IgiConnectionFileException) { }
            catch (IOException) { }
        }

        private void Forward(string text)
        {
            var line = new DaemonLogLine { Text = text, FromDaemon = true, Level = DaemonLogLine.LevelOf(text) };
            Post(() => { var h = Log; if (h != null) h(line); });
        }

        private void Say(string level, string text)
        {
            var line = new DaemonLogLine { Text = "[igi-launcher] " + text, FromDaemon = false, Level = level };
            Post(() => { var h = Log; if (h != null) h(line); });
        }

        private void Post(Action a) { _events.Post(a); }

        private static bool HasExited(Process p)
        {
            try { return p.HasExited; }
            catch (InvalidOperationException) { return true; }
        }

        private static int SafeId(Process p)
        {
            try { return p.Id; }
            catch (InvalidOperationException) { return 0; }
        }

        [DllImport("libc", EntryPoint = "kill", SetLastError = true)]
        private static extern int sys_kill(int pid, int sig);

        // SIGTERM on POSIX (the daemon stops as on shutdown_request). False where it cannot be sent: Windows has no
        // such signal for a process without a console of its own, so there Stop kills at once (pass the client to
        // stop it in order).
        private static bool Terminate(Process process)
        {
            if (!PosixFileMode.IsPosix) return false;
            try { return sys_kill(SafeId(process), 15) == 0; }
            catch (DllNotFoundException) { return false; }
            catch (EntryPointNotFoundException) { return false; }
        }
    }
}
