// Layer: core/launcher. The last save of each session the game saved, to restore after a daemon restart.
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;

namespace Igi.Launcher
{
    /// <summary>
    /// Records where the game last saved each session (<c>save_session_request</c>) under a key of the game's own
    /// (an NPC's name, say: session ids change when a daemon restarts), and opens every recorded save on a new
    /// daemon (<c>load_session_request</c>) after a restart. Only saved sessions come back, as of their last save;
    /// thread-safe.
    /// </summary>
    public sealed class SessionSaveBook
    {
        private readonly Dictionary<string, string> _paths = new Dictionary<string, string>();
        private readonly object _lock = new object();

        /// <summary>The recorded saves: key -> file.</summary>
        public Dictionary<string, string> Saves { get { lock (_lock) return new Dictionary<string, string>(_paths); } }

        /// <summary>Saves <paramref name="sessionId"/> to <paramref name="path"/> (null: the daemon's session folder)
        /// and records it under <paramref name="key"/>; returns the file written.</summary>
        public async Task<string> SaveAsync(IgiClient client, string key, string sessionId, string path = null, double timeoutS = 30.0)
        {
            if (client == null) throw new ArgumentNullException("client");
            if (string.IsNullOrEmpty(key)) throw new ArgumentException("key is empty");
            var reply = (SaveSessionReply)await client.SendAsync(new SaveSessionRequest { Path = path }, sessionId, timeoutS).ConfigureAwait(false);
            lock (_lock) _paths[key] = reply.Path;
            return reply.Path;
        }

        /// <summary>Records a save made elsewhere (e.g. a file from an earlier run of the game).</summary>
        public void Record(string key, string path)
        {
            if (string.IsNullOrEmpty(key) || string.IsNullOrEmpty(path)) throw new ArgumentException("key and path are required");
            lock (_lock) _paths[key] = path;
        }

        /// <summary>Forgets a key's save (its session closed for good); true if there was one.</summary>
        public bool Forget(string key)
        {
            lock (_lock) return _paths.Remove(key);
        }

        /// <summary>Opens every recorded save on the daemon <paramref name="client"/> is connected to. Each save is tried;
        /// one that fails (a missing or corrupt file) is reported in <see cref="RestoreResult.Failed"/> and kept.</summary>
        public async Task<RestoreResult> RestoreAllAsync(IgiClient client, double timeoutS = 60.0)
        {
            if (client == null) throw new ArgumentNullException("client");
            var result = new RestoreResult();
            foreach (var kv in Saves)
            {
                try
                {
                    result.Restored[kv.Key] = (LoadSessionReply)await client.SendAsync(new LoadSessionRequest { Path = kv.Value }, null, timeoutS).ConfigureAwait(false);
                }
                catch (IgiException e) { result.Failed[kv.Key] = e; }
            }
            return result;
        }
    }

    /// <summary>What <see cref="SessionSaveBook.RestoreAllAsync"/> brought back.</summary>
    public sealed class RestoreResult
    {
        /// <summary>key -> the reply (its <c>SessionId</c> is the session's new id, <c>NTurns</c> the turns restored).</summary>
        public readonly Dictionary<string, LoadSessionReply> Restored = new Dictionary<string, LoadSessionReply>();
        /// <summary>key -> why its save could not be opened.</summary>
        public readonly Dictionary<string, IgiException> Failed = new Dictionary<string, IgiException>();
    }
}
