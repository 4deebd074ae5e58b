// Layer: Unity adapter. One NPC's conversation: persona, system prompt, Say(text) streaming tokens into UnityEvents.
#if UNITY_5_3_OR_NEWER
using System.Threading.Tasks;
using Igi.Client;
using Igi.Protocol;
using UnityEngine;

namespace Igi.Unity
{
    /// <summary>
    /// An NPC that talks through the IGI daemon. <see cref="Say"/> streams the reply token by token into
    /// <see cref="onToken"/> (main thread), then <see cref="onReplyComplete"/> with the full text.
    /// The daemon session (KV cache, history) is opened on first use and closed in OnDestroy.
    /// </summary>
    public sealed class IgiNpcDialogue : MonoBehaviour
    {
        [Tooltip("Scene connection; empty = IgiConnection.Instance.")]
        public IgiConnection connection;

        [Tooltip("NPC name or role.")]
        public string persona = "Villager";

        [TextArea(3, 10)]
        public string systemPrompt = "You are a friendly villager in a fantasy town. Answer in one or two short sentences.";

        [Range(0f, 2f)] public float temperature = 0.7f;
        [Range(1, 1024)] public int maxTokens = 96;
        [Range(-100, 100)] public int priority;

        [Tooltip("Say() while a reply is streaming cancels that reply.")]
        public bool interruptOnSay = true;

        /// <summary>Each token's text as it arrives.</summary>
        public IgiStringEvent onToken = new IgiStringEvent();

        /// <summary>The full reply text (also after a cancel, with the partial text).</summary>
        public IgiStringEvent onReplyComplete = new IgiStringEvent();

        /// <summary>An error message (daemon unreachable, session lost, timeout).</summary>
        public IgiStringEvent onError = new IgiStringEvent();

        /// <summary>The daemon session id, null until the first Say.</summary>
        public string SessionId { get; private set; }

        /// <summary>True while a reply is streaming.</summary>
        public bool IsSpeaking { get { return _current != null && !_current.IsDone; } }

        /// <summary>The last terminal reply (finish reason, usage, timings).</summary>
        public GenerateReply LastReply { get; private set; }

        private Task<string> _session;
        private GenerateHandle _current;

        private IgiConnection Connection { get { return connection != null ? connection : IgiConnection.Instance; } }

        /// <summary>Sends the player's line; the reply streams into the events. Main thread.</summary>
        public void Say(string text) { SayWithImage(text, null); }

        /// <summary>
        /// Sends the player's line with an image the NPC is shown (protocol 1.1; the daemon needs a vision projector):
        /// <c>npc.SayWithImage("What do you see?", IgiImageCapture.FromCamera(Camera.main, 640, 360));</c>
        /// </summary>
        public async void SayWithImage(string text, Image image)
        {
            try
            {
                if (IsSpeaking)
                {
                    if (!interruptOnSay) { onError.Invoke("already speaking"); return; }
                    // The daemon frees the session once the cancelled reply is sent: a generate_request before that
                    // would be refused busy.
                    GenerateHandle interrupted = _current;
                    Observe(interrupted.Cancel());
                    try { await interrupted.Completion; }
                    catch (IgiException) { }  // it ended with an error: the session is free either way
                    if (this == null) return;  // destroyed meanwhile
                }
                IgiConnection conn = Connection;
                if (conn == null) { onError.Invoke("no IgiConnection in the scene"); return; }
                IgiClient client = await conn.ConnectAsync();
                if (this == null) return;
                string session = await EnsureSessionAsync(client);
                if (this == null)
                {
                    // destroyed while its session was being created: OnDestroy had no session to close
                    Observe(client.CloseSessionAsync(session));
                    return;
                }
                SessionId = session;
                _current = client.Generate(session, text,
                    token => onToken.Invoke(token.Text),
                    reply => { LastReply = reply; onReplyComplete.Invoke(reply.Text); },
                    error => { if (error is IgiNotFoundException) _session = null; onError.Invoke(error.Message); },
                    image: image);
            }
            catch (IgiException e)
            {
                _session = null;
                onError.Invoke(e.Message);
            }
        }

        /// <summary>Stops the streaming reply; onReplyComplete still fires with the partial text.</summary>
        public void Cancel()
        {
            if (IsSpeaking) _current.Cancel();
        }

        /// <summary>Continues in an existing daemon session, e.g. one reopened from a save after a daemon restart
        /// (<see cref="IgiDaemonLauncher.onSessionRestored"/>).</summary>
        public void AdoptSession(string sessionId)
        {
            SessionId = sessionId;
            _session = Task.FromResult(sessionId);
        }

        private Task<string> EnsureSessionAsync(IgiClient client)
        {
            if (_session == null || _session.IsFaulted || _session.IsCanceled)
            {
                var sampling = new Sampling { Temperature = temperature, MaxTokens = maxTokens };
                _session = client.CreateSessionAsync(persona, systemPrompt, sampling, priority);
            }
            return _session;
        }

        /// <summary>Lets a request run on unwaited, its failure observed (nothing waits for the answer).</summary>
        private static void Observe(Task task)
        {
            task.ContinueWith(t => { var ignored = t.Exception; });
        }

        private void OnDestroy()
        {
            IgiConnection conn = Connection;
            if (conn == null || conn.Client == null || SessionId == null) return;
            Cancel();
            conn.Client.CloseSessionAsync(SessionId).ContinueWith(t => { var ignored = t.Exception; });
        }
    }
}
#endif
