// Layer: Unity adapter. Owns the IgiClient of a scene: connects, pumps callbacks every frame, disposes.
#if UNITY_5_3_OR_NEWER
using System;
using System.IO;
using System.Threading.Tasks;
using Igi.Client;
using UnityEngine;
using UnityEngine.Events;

namespace Igi.Unity
{
    /// <summary>
    /// Connects to the IGI daemon with its connection file and delivers every client callback on the main
    /// thread by calling <see cref="IgiClient.Pump"/> from Update. Put one in the scene; NPCs and the budget
    /// governor find it through <see cref="Instance"/> when not wired in the Inspector.
    /// </summary>
    [DefaultExecutionOrder(-100)]
    [DisallowMultipleComponent]
    public sealed class IgiConnection : MonoBehaviour
    {
        [Tooltip("Daemon connection file. Empty: $IGI_CONNECTION_FILE, else <persistentDataPath>/igi/connection.json")]
        public string connectionFile = "";

        [Tooltip("Connect in Start (otherwise call ConnectAsync).")]
        public bool connectOnStart = true;

        [Tooltip("Log dropped messages and late replies to the console.")]
        public bool verboseLog;

        /// <summary>Raised once connected and the handshake is done.</summary>
        public UnityEvent onConnected = new UnityEvent();

        /// <summary>Raised with the error message when connecting fails.</summary>
        public IgiStringEvent onConnectionFailed = new IgiStringEvent();

        /// <summary>The first enabled connection in the scene.</summary>
        public static IgiConnection Instance { get; private set; }

        /// <summary>The client, null until connected.</summary>
        public IgiClient Client { get; private set; }

        /// <summary>True once connected and the daemon answers.</summary>
        public bool IsConnected { get { return Client != null && Client.IsDaemonAlive; } }

        /// <summary>Most callbacks pumped per frame (the budget governor sets it from the daemon's throttle).</summary>
        public int CallbacksPerFrame { get; set; } = int.MaxValue;

        [Tooltip("Connect a new client when the daemon stopped answering heartbeats (a debugger pause, a suspend, a stall): to the same daemon once it answers again, else to the one the launcher restarts.")]
        public bool reconnectWhenGone = true;

        private Task<IgiClient> _connecting;
        private int _generation;  // each ReconnectAsync starts a new one: a connect of an older one hands its client back
        private float _nextReconnectS;  // realtime of the next automatic reconnection try
        private bool _reconnecting;  // automatic reconnection under way until a connect succeeds

#pragma warning disable 0169, 0414  // read in the editor only (UNITY_EDITOR); serialized in every build alike
        [SerializeField, HideInInspector] private bool _reconnectAfterReload;  // serialized: survives a script reload
#pragma warning restore 0169, 0414

        private void OnEnable()
        {
            if (Instance == null) Instance = this;
#if UNITY_EDITOR
            UnityEditor.AssemblyReloadEvents.beforeAssemblyReload += BeforeAssemblyReload;
            if (_reconnectAfterReload)
            {
                _reconnectAfterReload = false;
                ReconnectInBackground();  // the scripts are back: a new client
            }
#endif
        }

        private void OnDisable()
        {
            if (Instance == this) Instance = null;
#if UNITY_EDITOR
            UnityEditor.AssemblyReloadEvents.beforeAssemblyReload -= BeforeAssemblyReload;
#endif
        }

#if UNITY_EDITOR
        // A script reload in play mode drops the client (not serialized) without OnDestroy, its I/O thread and socket
        // still running and sending heartbeats. Close it first; connect again after, unless a launcher does (its new
        // daemon's Ready reconnects).
        private void BeforeAssemblyReload()
        {
            if (Client == null) return;
            Client.Dispose();
            Client = null;
            _connecting = null;
            _reconnectAfterReload = connectOnStart;
        }
#endif

        private async void Start()
        {
            if (!connectOnStart) return;
            try { await ConnectAsync(); }
            catch (IgiException) { /* reported through onConnectionFailed */ }
        }

        /// <summary>The connection file path this component uses.</summary>
        public string ResolveConnectionFile()
        {
            if (!string.IsNullOrEmpty(connectionFile)) return connectionFile;
            string env = Environment.GetEnvironmentVariable("IGI_CONNECTION_FILE");
            if (!string.IsNullOrEmpty(env)) return env;
            return Path.Combine(Path.Combine(Application.persistentDataPath, "igi"), "connection.json");
        }

        /// <summary>Connects (once; later calls return the same task). Resumes on the main thread.</summary>
        public Task<IgiClient> ConnectAsync()
        {
            if (_connecting == null) _connecting = DoConnectAsync();
            return _connecting;
        }

        /// <summary>Disposes the client and connects again (a restarted daemon has a new connection file and key).</summary>
        public Task<IgiClient> ReconnectAsync()
        {
            if (Client != null)
            {
                Client.Dispose();
                Client.Pump();  // delivers the errors Dispose gave the requests in flight: no NPC waits on them for good
            }
            Client = null;
            _connecting = null;
            _generation++;
            return ConnectAsync();
        }

        private async Task<IgiClient> DoConnectAsync()
        {
            var options = new IgiClientOptions { ClientName = "unity-plugin " + Application.productName };
            if (verboseLog) options.Log = line => Debug.Log("[IGI] " + line);
            int generation = _generation;
            try
            {
                IgiClient client = await IgiClient.ConnectAsync(ResolveConnectionFile(), options);
                if (generation != _generation || this == null)
                {
                    // a newer connect took over meanwhile (ReconnectAsync), or this component is gone
                    client.Dispose();
                    if (this == null) throw new IgiClientClosedException("the IgiConnection was destroyed while it connected");
                    return await ConnectAsync();
                }
                Client = client;
                _reconnecting = false;
                Client.CallbackFailed += e => Debug.LogException(e, this);
                onConnected.Invoke();
                return Client;
            }
            catch (IgiException e)
            {
                if (generation != _generation) throw;  // a newer connect reports its own failure
                _connecting = null;
                Debug.LogWarning("[IGI] cannot connect to the daemon: " + e.Message, this);
                onConnectionFailed.Invoke(e.Message);
                throw;
            }
        }

        private void Update()
        {
            if (Client != null) Client.Pump(CallbacksPerFrame);
            // A client that declared its daemon gone refuses every request from now on: connect a new one (every 2 s
            // at most while the daemon does not answer). The budget governor rebinds to it and sends the budget again.
            bool gone = Client != null && !Client.IsDaemonAlive && _connecting != null && _connecting.IsCompleted;
            bool retry = _reconnecting && Client == null && _connecting == null;  // the last try failed
            if (reconnectWhenGone && (gone || retry) && Time.realtimeSinceStartup >= _nextReconnectS)
            {
                _reconnecting = true;
                _nextReconnectS = Time.realtimeSinceStartup + 2f;
                ReconnectInBackground();
            }
        }

        private async void ReconnectInBackground()
        {
            try { await ReconnectAsync(); }
            catch (IgiException) { /* reported through onConnectionFailed; tried again from Update */ }
        }

        private void OnDestroy()
        {
            if (Client != null) Client.Dispose();
            Client = null;
        }
    }

    /// <summary>A UnityEvent carrying a string (token text, reply text, error message).</summary>
    [Serializable]
    public sealed class IgiStringEvent : UnityEvent<string> { }
}
#endif
