// Layer: Unity adapter. Feeds Time.unscaledDeltaTime into the frame budget helper and exposes budget controls.
#if UNITY_5_3_OR_NEWER
using Igi.Budget;
using Igi.Client;
using Igi.Protocol;
using UnityEngine;

namespace Igi.Unity
{
    /// <summary>
    /// Reports the game's frame times to the daemon (frame_stats_request) and applies its pacing: the
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

        [Tooltip("Apply the daemon's proposed budgets automatically within the range below.")]
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

        private void Update()
        {
            IgiConnection conn = Connection;
            if (conn == null || !conn.IsConnected) return;
            // a new client (the connection reconnected to a restarted daemon): a helper of its own, and the budget again
            if (Helper == null || _helperClient != conn.Client) CreateHelper(conn);
            Helper.TargetFrameTimeMs = 1000.0 / Mathf.Max(1f, targetFrameRate);
            Helper.AutoAcceptProposals = autoAcceptProposals;
            Helper.MinBudgetMib = minBudgetMib;
            Helper.MaxBudgetMib = maxBudgetMib;
            Helper.AddFrame(Time.unscaledDeltaTime);
            conn.CallbacksPerFrame = Helper.PumpBudget;
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
