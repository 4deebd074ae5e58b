// Layer: core/client. Whether the daemon a connection file names still runs (PROTOCOL.md section 13).
using System;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Text;

namespace Igi.Client
{
    /// <summary>
    /// Whether a process a file names still runs: its pid and, on Linux, its start time in clock ticks since boot
    /// (<c>/proc/PID/stat</c> field 22, the connection file's <c>pid_start_ticks</c>), so that a pid the kernel gave
    /// to another process after the daemon died is not taken for the daemon. Elsewhere (macOS, Windows) the pid
    /// alone decides, through <see cref="Process.GetProcessById(int)"/>.
    /// </summary>
    public static class ProcessLiveness
    {
        /// <summary>
        /// False: no process has <paramref name="pid"/>, or the one that has it started at another time than
        /// <paramref name="startTicks"/> (Linux). True: it runs (with that start time, or none recorded, or none
        /// readable). Null: this runtime cannot tell, or the pid is not a process id.
        /// </summary>
        public static bool? IsRunning(int pid, long? startTicks)
        {
            if (pid <= 0) return null;
            try
            {
                if (Directory.Exists("/proc/self"))
                {
                    if (!Directory.Exists("/proc/" + pid.ToString(CultureInfo.InvariantCulture))) return false;
                    if (startTicks == null) return true;
                    long? now = StartTicks(pid);
                    return now == null || now.Value == startTicks.Value;
                }
                using (Process p = Process.GetProcessById(pid))
                {
                    try { return !p.HasExited; }
                    catch (InvalidOperationException) { return false; }
                    catch (System.ComponentModel.Win32Exception) { return true; }  // another user's process: it exists
                }
            }
            catch (ArgumentException) { return false; }  // GetProcessById: no process with this id
            catch (Exception e) when (e is IOException || e is UnauthorizedAccessException || e is InvalidOperationException ||
                                      e is NotSupportedException || e is PlatformNotSupportedException)
            {
                return null;
            }
        }

        /// <summary>The start time of process <paramref name="pid"/> in clock ticks since boot (Linux), or null.</summary>
        public static long? StartTicks(int pid)
        {
            string text;
            try { text = File.ReadAllText("/proc/" + pid.ToString(CultureInfo.InvariantCulture) + "/stat", Encoding.ASCII); }
            catch (Exception e) when (e is IOException || e is UnauthorizedAccessException || e is NotSupportedException) { return null; }
            // field 2 (comm) is parenthesised and may hold spaces or parentheses: count the fields after its last ')'
            int close = text.LastIndexOf(')');
            if (close < 0 || close + 2 > text.Length) return null;
            string[] fields = text.Substring(close + 2).Split(new[] { ' ' }, StringSplitOptions.RemoveEmptyEntries);
            long ticks;
            if (fields.Length < 20 || !long.TryParse(fields[19], NumberStyles.None, CultureInfo.InvariantCulture, out ticks)) return null;
            return ticks;
        }
    }
}
