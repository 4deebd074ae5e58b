// Layer: core/launcher. What the launcher starts and how it restarts it.
using System;
using System.Collections.Generic;
using System.IO;

namespace Igi.Launcher
{
    /// <summary>Settings of a <see cref="DaemonLauncher"/>. Only <see cref="ExecutablePath"/> and
    /// <see cref="ConnectionFile"/> are required.</summary>
    public sealed class DaemonLauncherOptions
    {
        /// <summary>The bundle's executable (<see cref="BundleExecutable"/> finds it in a bundle folder).</summary>
        public string ExecutablePath;

        /// <summary>Where the daemon writes its connection file (passed as <c>--connection-file</c>).</summary>
        public string ConnectionFile;

        /// <summary>More daemon flags, one argument each (e.g. <c>"--vram-budget-mib", "2048"</c>); quoted for you.</summary>
        public List<string> Arguments = new List<string>();

        /// <summary>Pass <c>--exit-with-pid</c> with this process's id (after <c>--port 0</c>, before
        /// <see cref="Arguments"/>): the daemon shuts down in order when the game's process is gone, so a game that
        /// crashes or is killed does not leave it running. False leaves the flag out.</summary>
        public bool ExitWithGame = true;

        /// <summary>Environment variables set for the daemon (a null value removes one).</summary>
        public Dictionary<string, string> Environment = new Dictionary<string, string>();

        /// <summary>Working directory; null = the executable's folder.</summary>
        public string WorkingDirectory;

        /// <summary>Longest wait for the connection file after a start, s; past it the process is killed and
        /// counted as a failed start.</summary>
        public double StartTimeoutS = 120.0;

        /// <summary>Delay before the first restart after a death, s; it doubles with each consecutive failure.</summary>
        public double RestartDelayS = 0.25;

        /// <summary>Cap of the restart delay, s.</summary>
        public double MaxRestartDelayS = 30.0;

        /// <summary>A daemon that served this long before dying starts the backoff afresh, s.</summary>
        public double StableUptimeS = 60.0;

        /// <summary>Consecutive failures (deaths before <see cref="StableUptimeS"/>, failed starts) after which the
        /// launcher gives up (<see cref="DaemonState.Failed"/>).</summary>
        public int MaxConsecutiveFailures = 8;

        /// <summary>How long <see cref="DaemonLauncher.Stop"/> waits for an orderly exit before killing, s.</summary>
        public double StopTimeoutS = 10.0;

        /// <summary>Checks the options; throws <see cref="ArgumentException"/> naming the bad one.</summary>
        public void Validate()
        {
            if (string.IsNullOrEmpty(ExecutablePath)) throw new ArgumentException("DaemonLauncherOptions.ExecutablePath is empty");
            if (string.IsNullOrEmpty(ConnectionFile)) throw new ArgumentException("DaemonLauncherOptions.ConnectionFile is empty");
            if (!(StartTimeoutS > 0)) throw new ArgumentException("StartTimeoutS must be > 0");
            if (!(RestartDelayS >= 0) || !(MaxRestartDelayS >= RestartDelayS)) throw new ArgumentException("need 0 <= RestartDelayS <= MaxRestartDelayS");
            if (MaxConsecutiveFailures < 1) throw new ArgumentException("MaxConsecutiveFailures must be >= 1");
            if (!(StopTimeoutS >= 0)) throw new ArgumentException("StopTimeoutS must be >= 0");
        }

        /// <summary>The executable of a daemon bundle folder (<c>igi-daemon.exe</c> on Windows, else <c>igi-daemon</c>).</summary>
        public static string BundleExecutable(string bundleDirectory)
        {
            bool windows = System.Environment.OSVersion.Platform == PlatformID.Win32NT;
            return Path.Combine(bundleDirectory, windows ? "igi-daemon.exe" : "igi-daemon");
        }
    }

    /// <summary>Where a launcher stands.</summary>
    public enum DaemonState
    {
        /// <summary>Not started, or stopped.</summary>
        Stopped,
        /// <summary>Process started, waiting for its connection file.</summary>
        Starting,
        /// <summary>The connection file is there: the daemon serves.</summary>
        Running,
        /// <summary>It died; waiting for the restart delay.</summary>
        Backoff,
        /// <summary>Too many consecutive failures: no more restarts.</summary>
        Failed,
    }

    /// <summary>The restart delays: <c>RestartDelayS * 2^(failures-1)</c>, capped at <c>MaxRestartDelayS</c>.</summary>
    public static class RestartBackoff
    {
        /// <summary>The delay before restart number <paramref name="consecutiveFailures"/> (1 = the first), s.</summary>
        public static double DelayS(int consecutiveFailures, double firstDelayS, double maxDelayS)
        {
            if (consecutiveFailures < 1) return 0.0;
            double delay = firstDelayS * Math.Pow(2.0, Math.Min(consecutiveFailures - 1, 30));
            return Math.Min(delay, maxDelayS);
        }
    }

    /// <summary>One line of the daemon's output (its structured log goes to stderr), or a line of the launcher's own.</summary>
    public sealed class DaemonLogLine
    {
        /// <summary>The text, without the line break.</summary>
        public string Text;
        /// <summary>From the daemon (stdout or stderr); false for the launcher's own lines.</summary>
        public bool FromDaemon;
        /// <summary>"debug", "info", "warning" or "error", read from the daemon's log record (json or kv); "info" when it has none.</summary>
        public string Level = "info";

        /// <summary>The level field of a daemon log line (<c>"level":"warning"</c> or <c>level=warning</c>).</summary>
        public static string LevelOf(string text)
        {
            if (text == null) return "info";
            foreach (string level in new[] { "error", "critical", "warning", "debug" })
            {
                if (text.IndexOf("\"level\":\"" + level + "\"", StringComparison.Ordinal) >= 0 ||
                    text.IndexOf("level=" + level, StringComparison.Ordinal) >= 0)
                    return level == "critical" ? "error" : level;
            }
            if (text.StartsWith("Traceback", StringComparison.Ordinal)) return "error";
            return "info";
        }
    }

    /// <summary>A daemon became ready (first start or restart).</summary>
    public sealed class DaemonReadyEventArgs
    {
        /// <summary>Its connection file, read and checked (pid = <see cref="Pid"/>).</summary>
        public Igi.Client.ConnectionInfo Connection;
        /// <summary>Its process id.</summary>
        public int Pid;
        /// <summary>0 for the first start, else the number of restarts so far.</summary>
        public int Restart;
        /// <summary>Process start to connection file, s.</summary>
        public double StartS;
        /// <summary>Time since the previous daemon died (0 for the first start), s: restart delay plus start.</summary>
        public double DownS;
    }

    /// <summary>A daemon died without being asked to stop.</summary>
    public sealed class DaemonExitedEventArgs
    {
        /// <summary>Its process id.</summary>
        public int Pid;
        /// <summary>Exit code (a signal shows as the runtime reports it, e.g. 137 or -9 for SIGKILL).</summary>
        public int ExitCode;
        /// <summary>How long it ran, s.</summary>
        public double UptimeS;
        /// <summary>Whether it had written its connection file.</summary>
        public bool WasReady;
        /// <summary>Delay before the restart, s; negative when the launcher gives up.</summary>
        public double RestartInS;
    }
}
