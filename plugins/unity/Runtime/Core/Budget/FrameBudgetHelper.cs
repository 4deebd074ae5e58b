// Layer: core/budget. Feeds frame times to the daemon and applies its pacing advice on the game side.
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Budget
{
    /// <summary>
    /// Frame-rate budget helper. Call <see cref="AddFrame(double, double)"/> once per frame on the main thread with the
    /// frame's interval (Unity: Time.unscaledDeltaTime) and its busy time (without the wait for vsync: a vsync-locked
    /// interval at the target rate sits inside the governor's band, so a throttle would never relax). Every
    /// <see cref="FrameTimeWindow.WindowS"/> seconds it sends frame_stats_request with the nearest-rank p95 of the
    /// frames since the last report (one request in flight at most; the frames meanwhile go into the next), and applies
    /// the frame_stats_reply on the main thread: <see cref="Throttle"/> bounds how many token callbacks
    /// <see cref="PumpBudget"/> lets through per frame, and a proposed budget is reported (<see cref="BudgetProposed"/>)
    /// and, with <see cref="AutoAcceptProposals"/>, applied when it lies in [<see cref="MinBudgetMib"/>,
    /// <see cref="MaxBudgetMib"/>]. The game sets explicit budgets with <see cref="SetBudget"/>; a proposal in a reply
    /// to a report sent before the game's last explicit budget is dropped (it was made for the budget before).
    /// </summary>
    public sealed class FrameBudgetHelper
    {
        private readonly IgiClient _client;
        private readonly FrameTimeWindow _window;
        private bool _inFlight;
        private long _minBudgetMib;
        private long _maxBudgetMib = long.MaxValue;
        private int _explicitBudgets;  // explicit budgets the game set: a reply to a report sent before one is stale
        private long? _lastBudgetMib;  // the budget the helper sent last (explicit or accepted)

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

        /// <summary>Smallest budget an automatic proposal may set, MiB (0 or more, at most <see cref="MaxBudgetMib"/>;
        /// set both at once with <see cref="SetProposalRange"/>).</summary>
        public long MinBudgetMib
        {
            get { return _minBudgetMib; }
            set { SetProposalRange(value, _maxBudgetMib); }
        }

        /// <summary>Largest budget an automatic proposal may set, MiB (at least <see cref="MinBudgetMib"/>).</summary>
        public long MaxBudgetMib
        {
            get { return _maxBudgetMib; }
            set { SetProposalRange(_minBudgetMib, value); }
        }

        /// <summary>Sets the range of the proposals applied automatically, MiB (one outside it is only reported).</summary>
        /// <exception cref="ArgumentOutOfRangeException">A negative minimum, or a minimum above the maximum.</exception>
        public void SetProposalRange(long minBudgetMib, long maxBudgetMib)
        {
            if (minBudgetMib < 0) throw new ArgumentOutOfRangeException("minBudgetMib", "the minimum budget is negative");
            if (minBudgetMib > maxBudgetMib)
                throw new ArgumentOutOfRangeException("minBudgetMib", "the minimum budget " + minBudgetMib + " MiB is above the maximum " + maxBudgetMib + " MiB");
            _minBudgetMib = minBudgetMib;
            _maxBudgetMib = maxBudgetMib;
        }

        /// <summary>Raised on the main thread when the throttle changes.</summary>
        public event Action<Throttle> ThrottleChanged;

        /// <summary>Raised on the main thread when the daemon proposes a budget.</summary>
        public event Action<long> BudgetProposed;

        /// <summary>Raised on the main thread when a report, a budget change or an auto-accept fails.</summary>
        public event Action<IgiException> Failed;

        /// <summary>Adds one frame whose busy time is its interval (a vsync-locked interval shows no headroom: prefer
        /// <see cref="AddFrame(double, double)"/>) and sends a report when the window is full. Main thread.</summary>
        /// <param name="frameTimeS">The frame's unscaled duration, s.</param>
        /// <returns>True when a frame_stats_request was sent for this frame.</returns>
        public bool AddFrame(double frameTimeS)
        {
            return AddFrame(frameTimeS, frameTimeS);
        }

        /// <summary>Adds one frame and sends a report when the window is full. Main thread.</summary>
        /// <param name="intervalS">The frame's unscaled duration, s (Time.unscaledDeltaTime): fills the window.</param>
        /// <param name="busyTimeS">The time the frame took to produce, s, without the wait for vsync or a frame limiter
        /// (FrameTimingManager's main thread, render thread and GPU times); NaN = unknown: the interval instead.</param>
        /// <returns>True when a frame_stats_request was sent for this frame.</returns>
        public bool AddFrame(double intervalS, double busyTimeS)
        {
            if (!_window.AddFrame(intervalS, busyTimeS)) return false;
            if (_inFlight) return false;  // never queue reports behind a slow one: its frames go into the next
            FrameTimeSummary summary = _window.TakeSummary();
            if (!_client.IsDaemonAlive) return false;
            LastReport = summary;
            _inFlight = true;
            int explicitBudgets = _explicitBudgets;
            Observe(_client.SendFrameStatsAsync(summary.P95Ms, TargetFrameTimeMs, FreeVramMib, GpuBusyPct),
                    reply => OnReply(reply, explicitBudgets));
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
            BudgetSetElsewhere();
            Send(vramBudgetMib, reason, onAck, levelsMib);
        }

        /// <summary>Tells the helper the game set a budget without it (a reclaim_request, <see cref="IgiClient.SetBudgetAsync"/>):
        /// a proposal in a reply to a report sent before is dropped, not applied over the game's budget.</summary>
        public void BudgetSetElsewhere()
        {
            _explicitBudgets++;
            _lastBudgetMib = null;
        }

        private void Send(long vramBudgetMib, string reason, Action<BudgetAck> onAck, IList<long> levelsMib)
        {
            _lastBudgetMib = vramBudgetMib;
            Observe(_client.SetBudgetAsync(vramBudgetMib, reason, levelsMib), ack => { if (onAck != null) onAck(ack); },
                    () => { if (_lastBudgetMib == vramBudgetMib) _lastBudgetMib = null; });  // the daemon may not have it
        }

        private void OnReply(FrameStatsReply reply, int explicitBudgetsAtReport)
        {
            RepliesReceived++;
            bool changed = reply.Throttle.TokensPerFrame != Throttle.TokensPerFrame ||
                           reply.Throttle.SleepMsBetweenTokens != Throttle.SleepMsBetweenTokens;
            Throttle = reply.Throttle;
            if (changed && ThrottleChanged != null) ThrottleChanged(Throttle);
            // A proposal made before the game's last explicit budget is for the budget before it: dropped.
            bool stale = explicitBudgetsAtReport != _explicitBudgets;
            ProposedBudgetMib = stale ? null : reply.ProposedBudgetMib;
            if (!ProposedBudgetMib.HasValue) return;
            long proposed = ProposedBudgetMib.Value;
            if (BudgetProposed != null) BudgetProposed(proposed);
            if (!AutoAcceptProposals) return;
            // Applied only inside the game's range: a value clamped into it would reach the daemon as an explicit budget,
            // its new ceiling, and a shrink clamped to the minimum would then keep the budget there for good.
            if (proposed < _minBudgetMib || proposed > _maxBudgetMib || proposed == _lastBudgetMib) return;
            Send(proposed, "accepted daemon proposal", null, null);
        }

        // Runs the continuation (or Failed) on the main thread through the client's callback queue.
        private void Observe<T>(Task<T> task, Action<T> onResult, Action onFailure = null)
        {
            bool isReport = typeof(T) == typeof(FrameStatsReply);
            task.ContinueWith(t => _client.Post(() =>
            {
                if (isReport) _inFlight = false;
                if (t.Status == TaskStatus.RanToCompletion) { onResult(t.Result); return; }
                Exception e = t.Exception != null ? t.Exception.GetBaseException() : null;
                if (onFailure != null) onFailure();
                var failure = e as IgiException ?? new IgiException("request failed: " + (e != null ? e.Message : "cancelled"), e);
                if (Failed != null) Failed(failure);
            }), TaskScheduler.Default);
        }
    }
}
