// Layer: core/client. One streaming generation: its id, progress and cancellation.
using System.Text;
using System.Threading.Tasks;
using Igi.Protocol;

namespace Igi.Client
{
    /// <summary>
    /// A generate_request in flight. Token and completion callbacks run on the thread that calls
    /// <see cref="IgiClient.Pump"/>; <see cref="Completion"/> completes on a thread-pool thread.
    /// </summary>
    public sealed class GenerateHandle
    {
        private readonly IgiClient _client;
        private readonly StringBuilder _text = new StringBuilder();
        private readonly object _lock = new object();
        private int _tokens;

        internal GenerateHandle(IgiClient client, string msgId, string sessionId, Task<GenerateReply> completion)
        {
            _client = client;
            MsgId = msgId;
            SessionId = sessionId;
            Completion = completion;
        }

        /// <summary>The generate_request's msg_id (cancel_request.target_msg_id).</summary>
        public string MsgId { get; private set; }

        /// <summary>The NPC session.</summary>
        public string SessionId { get; private set; }

        /// <summary>Completes with the terminal generate_reply, or faults with an <see cref="IgiException"/>.</summary>
        public Task<GenerateReply> Completion { get; private set; }

        /// <summary>True once the terminal reply (or a failure) arrived.</summary>
        public bool IsDone { get { return Completion.IsCompleted; } }

        /// <summary>The text of the tokens received so far (thread-safe snapshot).</summary>
        public string TextSoFar { get { lock (_lock) return _text.ToString(); } }

        /// <summary>Token events received so far.</summary>
        public int TokensReceived { get { lock (_lock) return _tokens; } }

        internal void Append(TokenEvent token)
        {
            lock (_lock)
            {
                _text.Append(token.Text);
                _tokens++;
            }
        }

        /// <summary>
        /// Asks the daemon to stop this generation (priority path). The generation still ends through
        /// onDone with finish_reason "cancelled" (or "stop"/"length" if it finished first).
        /// </summary>
        /// <returns>The cancel_reply: Cancelled is false when the target had already finished.</returns>
        public Task<CancelReply> Cancel()
        {
            return _client.CancelAsync(MsgId);
        }
    }
}
