// Layer: core/budget. Feeds frame times to the daemon and applies its pacing advice on the game side.
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Budget
{
    /// <summary>
    /// Frame-rate budget helper. Call <see cref="AddFrame"/> once per frame on the main thread (Unity:
    /// Time.unscaledDeltaTime). Every <see cref="FrameTimeWindow.WindowS"/> seconds it sends frame_stats_request
    /// with the window's p95 frame time (one request in flight at most), and applies the frame_stats_reply on the
    /// main thread: <see cref="Throttle"/> bounds how many token callbacks <see cref="PumpBudget"/> lets through per
    /// frame, and a proposed budget is either reported (<see cref="BudgetProposed"/>) or, with
    /// <see cref="AutoAcceptProposals"/>, applied within [<see cref="MinBudgetMib"/>, <see cref="MaxBudgetMib"/>].
    /// The game sets explicit budgets with <see cref="SetBudget"/>.
    /// </summary>
    public sealed class FrameBudgetHelper
    {
        private readonly IgiClient _client;
        private readonly FrameTimeWindow _window;
        private bool _inFlight;

        /// <summary>Creates the helper.</summary>
        /// <param name="client">A connected client.</param>
        /// <param name="targetFrameTimeMs">Frame time the game aims for, ms (16.7 for 60 fps).</param>
        /// <param name="reportIntervalS">Seconds of frames per frame_stats_request (the spec asks for at most a few per second).</param>
        public FrameBudgetHelper(IgiClient client, double targetFrameTimeMs = 1000.0 / 60.0, double reportIntervalS = 0.5)
        {
            if (client == null) throw new ArgumentNullException("client");
            if (!(targetFrameTimeMs > 0)) throw new ArgumentOutOfRangeException("targetFrameTimeMs");
            _client = client;
            _window = new FrameTimeWindow(reportIntervalS);
            TargetFrameTimeMs = targetFrameTimeMs;
            Throttle = new Throttle();
        }

        /// <summary>Frame time the game aims for, ms.</summary>
        public double TargetFrameTimeMs { get; set; }

        /// <summary>Free device memory the game sees, MiB (sent with each report; null = unknown).</summary>
        public double? FreeVramMib { get; set; }

        /// <summary>GPU utilisation the game sees, % (null = unknown).</summary>
        public double? GpuBusyPct { get; set; }

        /// <summary>The pacing in force, from the last frame_stats_reply.</summary>
        public Throttle Throttle { get; private set; }

        /// <summary>The last budget the daemon proposed, MiB (null = none).</summary>
        public long? ProposedBudgetMib { get; private set; }

        /// <summary>Summary of the last reported window.</summary>
        public FrameTimeSummary LastReport { get; private set; }

        /// <summary>frame_stats_requests answered so far.</summary>
        public int RepliesReceived { get; private set; }

        /// <summary>Apply daemon budget proposals automatically (within the min/max below).</summary>
        public bool AutoAcceptProposals { get; set; }

        /// <summary>Smallest budget an automatic proposal may set, MiB.</summary>
        public long MinBudgetMib { get; set; }

        /// <summary>Largest budget an automatic proposal may set, MiB.</summary>
        public long MaxBudgetMib { get; set; } = long.MaxValue;

        /// <summary>Raised on the main thread when the throttle changes.</summary>
        public event Action<Throttle> ThrottleChanged;

        /// <summary>Raised on the main thread when the daemon proposes a budget.</summary>
        public event Action<long> BudgetProposed;

        /// <summary>Raised on the main thread when a report, a budget change or an auto-accept fails.</summary>
        public event Action<IgiException> Failed;

        /// <summary>Adds one frame and sends a report when the window is full. Main thread.</summary>
        /// <param name="frameTimeS">The frame's unscaled duration, s.</param>
        /// <returns>True when a frame_stats_request was sent for this frame.</returns>
        public bool AddFrame(double frameTimeS)
        {
            if (!_window.AddFrame(frameTimeS)) return false;
            FrameTimeSummary summary = _window.TakeSummary();
            if (_inFlight || !_client.IsDaemonAlive) return false;  // never queue reports behind a slow one
            LastReport = summary;
            _inFlight = true;
            Observe(_client.SendFrameStatsAsync(summary.P95Ms, TargetFrameTimeMs, FreeVramMib, GpuBusyPct), OnReply);
            return true;
        }

        /// <summary>
        /// How many queued callbacks to pump this frame: the throttle's tokens_per_frame, or unlimited when the daemon
        /// sets none. Use as <c>client.Pump(helper.PumpBudget)</c>. Terminal callbacks (onDone, onError) and the helper's
        /// own events share the budget, so the game never gets more than tokens_per_frame token callbacks in one frame.
        /// </summary>
        public int PumpBudget
        {
            get
            {
                long? n = Throttle.TokensPerFrame;
                return n.HasValue && n.Value > 0 ? (int)Math.Min(int.MaxValue, n.Value) : int.MaxValue;
            }
        }

        /// <summary>Sets an explicit VRAM budget; the ack (or failure) comes back on the main thread.
        /// <paramref name="levelsMib"/> (protocol 1.3): the budget levels the game will ask for, planned ahead by the
        /// daemon (see <see cref="IgiClient.SetBudgetAsync"/>); null = keep those declared before.</summary>
        public void SetBudget(long vramBudgetMib, string reason, Action<BudgetAck> onAck = null, IList<long> levelsMib = null)
        {
            Observe(_client.SetBudgetAsync(vramBudgetMib, reason, levelsMib), ack => { if (onAck != null) onAck(ack); });
        }

        private void OnReply(FrameStatsReply reply)
        {
            RepliesReceived++;
            bool changed = reply.Throttle.TokensPerFrame != Throttle.TokensPerFrame ||
                           reply.Throttle.SleepMsBetweenTokens != Throttle.SleepMsBetweenTokens;
            Throttle = reply.Throttle;
            if (changed && ThrottleChanged != null) ThrottleChanged(Throttle);
            ProposedBudgetMib = reply.ProposedBudgetMib;
            if (!reply.ProposedBudgetMib.HasValue) return;
            long proposed = reply.ProposedBudgetMib.Value;
            if (BudgetProposed != null) BudgetProposed(proposed);
            if (AutoAcceptProposals && proposed >= MinBudgetMib && proposed <= MaxBudgetMib)
                SetBudget(proposed, "accepted daemon proposal");
        }

        // Runs the continuation (or Failed) on the main thread through the client's callback queue.
        private void Observe<T>(Task<T> task, Action<T> onResult)
        {
            bool isReport = typeof(T) == typeof(FrameStatsReply);
            task.ContinueWith(t => _client.Post(() =>
            {
                if (isReport) _inFlight = false;
                if (t.Status == TaskStatus.RanToCompletion) { onResult(t.Result); return; }
                Exception e = t.Exception != null ? t.Exception.GetBaseException() : null;
                var failure = e as IgiException ?? new IgiException("request failed: " + (e != null ? e.Message : "cancelled"), e);
                if (Failed != null) Failed(failure);
            }), TaskScheduler.Default);
        }
    }
}
