// Layer: Unity adapter. Feeds each frame's busy time into the frame budget helper and exposes budget controls.
#if UNITY_5_3_OR_NEWER
using Igi.Budget;
using Igi.Client;
using Igi.Protocol;
using UnityEngine;

namespace Igi.Unity
{
    /// <summary>
    /// Reports the game's frame busy times to the daemon (frame_stats_request) and applies its pacing: the
    /// connection pumps at most tokens_per_frame callbacks per frame. Budgets: an initial budget on connect,
    /// explicit <see cref="SetBudget"/> / <see cref="Reclaim"/>, and optional automatic acceptance of the
    /// daemon's proposals within [minBudgetMib, maxBudgetMib].
    /// </summary>
    public sealed class IgiBudgetGovernor : MonoBehaviour
    {
        [Tooltip("Scene connection; empty = IgiConnection.Instance.")]
        public IgiConnection connection;

        [Tooltip("Frame rate the game aims for.")]
        public float targetFrameRate = 60f;

        [Tooltip("Seconds of frames per frame_stats report (a few per second at most).")]
        public float reportIntervalS = 0.5f;

        [Tooltip("VRAM budget to set once connected, MiB; -1 = leave the daemon's budget.")]
        public int initialBudgetMib = -1;

        [Tooltip("Budget levels the game will ask for, MiB (protocol 1.3; e.g. menu 6144, play 2048, cutscene 0), declared with the initial budget so that the daemon plans them ahead; empty = declare none.")]
        public int[] budgetLevelsMib = new int[0];

        [Tooltip("Report each frame's busy time from FrameTimingManager (enable Frame Timing Stats in the Player settings; Unity 2022.1+) instead of Time.unscaledDeltaTime, which with vsync on reads the target and hides headroom.")]
        public bool reportBusyTime = true;

        [Tooltip("Apply the daemon's proposed budgets automatically, clamped to the range below.")]
        public bool autoAcceptProposals;
        public int minBudgetMib;
        public int maxBudgetMib = 8192;

        /// <summary>The helper, null until connected.</summary>
        public FrameBudgetHelper Helper { get; private set; }

        /// <summary>The last budget_ack received.</summary>
        public BudgetAck LastAck { get; private set; }

        private IgiConnection Connection { get { return connection != null ? connection : IgiConnection.Instance; } }

        private IgiClient _helperClient;  // the client the helper sends through
        private int _budgetMib = -1;  // the budget the game set last (SetBudget), sent again to a new client
        private string _budgetReason;
        private int[] _budgetLevelsMib;
        private double _gameBusyTimeS = double.NaN;  // SetBusyFrameTime for this frame
        private bool _toldInterval, _toldRange;  // the fallback to the interval, a bad range: logged once
#if UNITY_2022_1_OR_NEWER
        private readonly FrameTiming[] _timings = new FrameTiming[1];
#endif

        private void Update()
        {
            IgiConnection conn = Connection;
            if (conn == null || !conn.IsConnected) return;
            // a new client (the connection reconnected to a restarted daemon): a helper of its own, and the budget again
            if (Helper == null || _helperClient != conn.Client) CreateHelper(conn);
            Helper.TargetFrameTimeMs = 1000.0 / Mathf.Max(1f, targetFrameRate);
            bool rangeOk = minBudgetMib >= 0 && minBudgetMib <= maxBudgetMib;
            if (!rangeOk && !_toldRange) Debug.LogWarning("[IGI] budget: minBudgetMib is negative or above maxBudgetMib: proposals are not applied", this);
            _toldRange = !rangeOk;
            Helper.AutoAcceptProposals = autoAcceptProposals && rangeOk;
            if (rangeOk) Helper.SetProposalRange(minBudgetMib, maxBudgetMib);
            double busyS = !double.IsNaN(_gameBusyTimeS) ? _gameBusyTimeS : reportBusyTime ? EngineBusyTimeS() : double.NaN;
            _gameBusyTimeS = double.NaN;
            if (reportBusyTime && double.IsNaN(busyS) && !_toldInterval)
            {
                _toldInterval = true;
                Debug.Log("[IGI] budget: no frame busy time (FrameTimingManager off: enable Frame Timing Stats, Unity 2022.1+); reporting the frame interval, which shows no headroom under vsync", this);
            }
            Helper.AddFrame(Time.unscaledDeltaTime, busyS);
            conn.CallbacksPerFrame = Helper.PumpBudget;
        }

        /// <summary>This frame's busy time as the game measures it, ms: reported instead of FrameTimingManager's. Call
        /// it each frame before this component's Update; it holds for one frame.</summary>
        public void SetBusyFrameTime(double busyFrameTimeMs)
        {
            _gameBusyTimeS = busyFrameTimeMs / 1000.0;
        }

        // The last frame's busy time, s: the longest of FrameTimingManager's main thread, render thread and GPU times
        // (none includes the wait for vsync or the target frame rate); NaN when the engine gives none.
        private double EngineBusyTimeS()
        {
#if UNITY_2022_1_OR_NEWER
            if (FrameTimingManager.IsFeatureEnabled())
            {
                FrameTimingManager.CaptureFrameTimings();
                if (FrameTimingManager.GetLatestTimings(1, _timings) == 1)
                {
                    FrameTiming t = _timings[0];
                    double ms = System.Math.Max(t.cpuMainThreadFrameTime, System.Math.Max(t.cpuRenderThreadFrameTime, t.gpuFrameTime));
                    if (ms > 0) return ms / 1000.0;
                }
            }
#endif
            return double.NaN;
        }

        private void CreateHelper(IgiConnection conn)
        {
            _helperClient = conn.Client;
            Helper = new FrameBudgetHelper(conn.Client, 1000.0 / Mathf.Max(1f, targetFrameRate), Mathf.Max(0.05f, reportIntervalS));
            Helper.Failed += e => Debug.LogWarning("[IGI] budget: " + e.Message, this);
            Helper.ThrottleChanged += t => Debug.Log("[IGI] throttle: tokens_per_frame=" + (t.TokensPerFrame.HasValue ? t.TokensPerFrame.Value.ToString() : "unlimited"), this);
            if (_budgetMib >= 0) SetBudget(_budgetMib, _budgetReason, _budgetLevelsMib);
            else if (initialBudgetMib >= 0) SetBudget(initialBudgetMib, "initial budget", budgetLevelsMib);
        }

        /// <summary>Sets the VRAM budget the game allows the daemon, MiB (0 = CPU only).</summary>
        public void SetBudget(int vramBudgetMib, string reason)
        {
            SetBudget(vramBudgetMib, reason, null);
        }

        /// <summary>Sets the VRAM budget and declares the budget levels the game will ask for (protocol 1.3), which the
        /// daemon plans ahead so that a later change to one of them needs no planning; null or empty = keep the
        /// levels declared before.</summary>
        public void SetBudget(int vramBudgetMib, string reason, int[] levelsMib)
        {
            if (Helper == null) { Debug.LogWarning("[IGI] SetBudget before the connection is up", this); return; }
            _budgetMib = vramBudgetMib;
            _budgetReason = reason;
            if (levelsMib != null && levelsMib.Length > 0) _budgetLevelsMib = levelsMib;  // null or empty: kept
            System.Collections.Generic.List<long> levels = null;
            if (levelsMib != null && levelsMib.Length > 0)
            {
                levels = new System.Collections.Generic.List<long>(levelsMib.Length);
                foreach (int level in levelsMib) levels.Add(level);
            }
            Helper.SetBudget(vramBudgetMib, reason, ack => LastAck = ack, levels);
        }

        /// <summary>Urgently shrinks the daemon's VRAM use (e.g. before loading a heavy level). The ack arrives on the main thread.</summary>
        public void Reclaim(int vramBudgetMib, float deadlineS)
        {
            IgiConnection conn = Connection;
            if (conn == null || conn.Client == null) return;
            if (Helper != null) Helper.BudgetSetElsewhere();  // a proposal under way is for the budget before
            var client = conn.Client;
            client.ReclaimAsync(vramBudgetMib, deadlineS).ContinueWith(t => client.Post(() =>
            {
                if (t.Status == System.Threading.Tasks.TaskStatus.RanToCompletion) LastAck = t.Result;
                else Debug.LogWarning("[IGI] reclaim failed: " + t.Exception.GetBaseException().Message, this);
            }));
        }

        private void OnDisable()
        {
            IgiConnection conn = Connection;
            if (conn != null) conn.CallbacksPerFrame = int.MaxValue;
        }
    }
}
#endif
