// Layer: Unity adapter. Starts the self-contained daemon bundle with the game, keeps it running, stops it on quit.
#if UNITY_5_3_OR_NEWER
using System;
using System.Collections.Generic;
using System.IO;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Launcher;
using UnityEngine;
using UnityEngine.Events;

namespace Igi.Unity
{
    /// <summary>
    /// Launches the daemon bundle (default <c>StreamingAssets/igi-daemon</c>), points the scene's
    /// <see cref="IgiConnection"/> at its connection file and connects it each time the daemon is ready. When the daemon
    /// dies it is restarted with backoff (<see cref="DaemonLauncher"/>); after a restart the connection is made again and
    /// every session saved through <see cref="SaveSessionAsync"/> is reopened from its last save
    /// (<see cref="onSessionRestored"/> gives each one's new session id). The daemon's log goes to the Console.
    /// Quitting the game stops the daemon (<c>shutdown_request</c>, then a kill after the stop timeout).
    /// </summary>
    [DefaultExecutionOrder(-200)]
    [DisallowMultipleComponent]
    public sealed class IgiDaemonLauncher : MonoBehaviour
    {
        [Tooltip("The bundle folder (holds igi-daemon / igi-daemon.exe). Empty: <StreamingAssets>/igi-daemon")]
        public string bundlePath = "";

        [Tooltip("Connection file the daemon writes. Empty: <persistentDataPath>/igi/connection.json")]
        public string connectionFile = "";

        [Tooltip("The connection to drive. Empty: the IgiConnection on this GameObject, else IgiConnection.Instance")]
        public IgiConnection connection;

        [Tooltip("More daemon flags, one argument per entry (e.g. --vram-budget-mib, 2048)")]
        public string[] extraArguments = new string[0];

        [Tooltip("Pass --exit-with-pid with the game's process id: the daemon shuts down when the game crashes or is killed")]
        public bool exitWithGame = true;

        [Tooltip("Start the daemon in Awake (otherwise call Launch).")]
        public bool launchOnAwake = true;

        [Tooltip("Delay before the first restart, s (doubles per consecutive failure)")]
        public float restartDelayS = 0.25f;

        [Tooltip("Cap of the restart delay, s")]
        public float maxRestartDelayS = 30f;

        [Tooltip("Failures in a row before giving up")]
        public int maxConsecutiveFailures = 8;

        [Tooltip("Longest wait for the connection file after a start, s")]
        public float startTimeoutS = 120f;

        [Tooltip("Forward the daemon's info lines too (warnings and errors are always forwarded)")]
        public bool forwardInfoLog = true;

        /// <summary>The daemon is ready and the connection is connected (first start and every restart).</summary>
        public UnityEvent onDaemonReady = new UnityEvent();

        /// <summary>A saved session was reopened after a restart: (save key, new session id).</summary>
        public IgiSessionRestoredEvent onSessionRestored = new IgiSessionRestoredEvent();

        /// <summary>The launcher gave up (the message says why).</summary>
        public IgiStringEvent onDaemonFailed = new IgiStringEvent();

        /// <summary>The first enabled launcher in the scene.</summary>
        public static IgiDaemonLauncher Instance { get; private set; }

        /// <summary>The supervisor, null before <see cref="Launch"/>.</summary>
        public DaemonLauncher Launcher { get; private set; }

        /// <summary>The sessions saved through <see cref="SaveSessionAsync"/>, restored after each restart.</summary>
        public SessionSaveBook Saves { get; } = new SessionSaveBook();

        private IgiConnection Connection
        {
            get
            {
                if (connection == null) connection = GetComponent<IgiConnection>();
                return connection != null ? connection : IgiConnection.Instance;
            }
        }

        /// <summary>The bundle's executable this component starts.</summary>
        public string ResolveExecutable()
        {
            string dir = string.IsNullOrEmpty(bundlePath) ? Path.Combine(Application.streamingAssetsPath, "igi-daemon") : bundlePath;
            return DaemonLauncherOptions.BundleExecutable(dir);
        }

        /// <summary>The connection file the daemon writes.</summary>
        public string ResolveConnectionFile()
        {
            if (!string.IsNullOrEmpty(connectionFile)) return connectionFile;
            return Path.Combine(Path.Combine(Application.persistentDataPath, "igi"), "connection.json");
        }

        private void Awake()
        {
            if (Instance == null) Instance = this;
            IgiConnection conn = Connection;
            if (conn != null)
            {
                conn.connectionFile = ResolveConnectionFile();
                conn.connectOnStart = false;  // connected here, once the daemon is ready
            }
            if (launchOnAwake) Launch();
        }

        /// <summary>Starts the daemon (once).</summary>
        public void Launch()
        {
            if (Launcher != null) return;
            var options = new DaemonLauncherOptions
            {
                ExecutablePath = ResolveExecutable(), ConnectionFile = ResolveConnectionFile(),
                Arguments = new List<string>(extraArguments ?? new string[0]), ExitWithGame = exitWithGame,
                RestartDelayS = restartDelayS, MaxRestartDelayS = Math.Max(restartDelayS, maxRestartDelayS),
                MaxConsecutiveFailures = Math.Max(1, maxConsecutiveFailures), StartTimeoutS = Math.Max(1f, startTimeoutS),
            };
            Launcher = new DaemonLauncher(options);
            Launcher.Log += Forward;
            Launcher.Ready += OnReady;
            Launcher.Failed += message => { Debug.LogError("[IGI] " + message, this); onDaemonFailed.Invoke(message); };
            Launcher.HandlerFailed += e => Debug.LogException(e, this);
            Launcher.Start();
        }

        /// <summary>Saves an NPC's session and records it under <paramref name="key"/> for restore after a restart.</summary>
        public Task<string> SaveSessionAsync(string key, string sessionId, string path = null)
        {
            IgiConnection conn = Connection;
            if (conn == null || conn.Client == null) throw new InvalidOperationException("not connected to the daemon");
            return Saves.SaveAsync(conn.Client, key, sessionId, path);
        }

        private async void OnReady(DaemonReadyEventArgs ready)
        {
            IgiConnection conn = Connection;
            if (conn == null) { Debug.LogWarning("[IGI] the daemon is ready but there is no IgiConnection", this); return; }
            try
            {
                IgiClient client = await conn.ReconnectAsync();
                if (ready.Restart > 0)
                {
                    RestoreResult result = await Saves.RestoreAllAsync(client);
                    foreach (var kv in result.Restored) onSessionRestored.Invoke(kv.Key, kv.Value.SessionId);
                    foreach (var kv in result.Failed) Debug.LogWarning("[IGI] cannot restore session '" + kv.Key + "': " + kv.Value.Message, this);
                }
                onDaemonReady.Invoke();
            }
            catch (IgiException e)
            {
                Debug.LogWarning("[IGI] the daemon started but connecting failed: " + e.Message, this);
            }
        }

        private void Forward(DaemonLogLine line)
        {
            string text = (line.FromDaemon ? "[igi-daemon] " : "[IGI] ") + line.Text;
            if (line.Level == "error") Debug.LogError(text, this);
            else if (line.Level == "warning") Debug.LogWarning(text, this);
            else if (forwardInfoLog) Debug.Log(text, this);
        }

        private void Update()
        {
            if (Launcher != null) Launcher.Pump();
        }

        /// <summary>Stops the daemon (also on quit and destroy).</summary>
        public void Shutdown()
        {
            if (Launcher == null) return;
            IgiConnection conn = Connection;
            Launcher.Stop(conn != null ? conn.Client : null);
            Launcher.Pump();
            Launcher = null;
        }

        private void OnApplicationQuit() { Shutdown(); }

#pragma warning disable 0169, 0414  // read in the editor only (UNITY_EDITOR); serialized in every build alike
        [SerializeField, HideInInspector] private bool _relaunchAfterReload;  // serialized: survives a script reload
#pragma warning restore 0169, 0414

#if UNITY_EDITOR
        private void OnEnable()
        {
            if (Instance == null) Instance = this;  // statics are reset by a script reload; Awake does not run again
            UnityEditor.AssemblyReloadEvents.beforeAssemblyReload += BeforeAssemblyReload;
            if (!_relaunchAfterReload) return;
            _relaunchAfterReload = false;
            Launch();  // the scripts are back: a new daemon (its Ready reconnects the IgiConnection)
        }

        private void OnDisable()
        {
            UnityEditor.AssemblyReloadEvents.beforeAssemblyReload -= BeforeAssemblyReload;
        }

        // A script reload in play mode drops this component's launcher (not serialized) without OnDestroy: the daemon
        // would run on unsupervised, for as long as the editor (its --exit-with-pid). Stop it first, launch again after.
        private void BeforeAssemblyReload()
        {
            if (Launcher == null) return;
            Shutdown();
            _relaunchAfterReload = true;
        }
#endif

        private void OnDestroy()
        {
            Shutdown();
            if (Instance == this) Instance = null;
        }
    }

    /// <summary>A UnityEvent carrying (save key, new session id).</summary>
    [Serializable]
    public sealed class IgiSessionRestoredEvent : UnityEvent<string, string> { }
}
#endif
