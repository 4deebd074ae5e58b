// igi/client.hpp - IgiClientCore, client layer: igi::Client, the game-side connection to one daemon.
//
// Threading: one background I/O thread owns the ZeroMQ DEALER socket (sends, receives, heartbeats,
// deadlines). Blocking calls (Connect, CreateSession, SetBudget, ...) wait for their reply on the
// caller's thread with a timeout. Asynchronous calls (Generate, Cancel, *Async) never block: their
// callbacks are queued by the I/O thread and run only inside Pump(), on the thread that calls it
// (the game thread). All public methods are thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "igi/connection_file.hpp"
#include "igi/envelope.hpp"
#include "igi/errors.hpp"
#include "igi/messages.hpp"

namespace igi {

/// ipc/PROTOCOL.md 11: a client sends heartbeats at most this often; a smaller hello_reply.heartbeat_interval_s
/// (0 included) is read as this. Without a floor, an announced 1e-6 made the I/O loop send one on every turn.
inline constexpr double kMinHeartbeatIntervalS = 0.1;

/// Tunables of a Client; every wait has a deadline.
struct ClientOptions {
  std::string client_name = "unreal-plugin";
  std::string client_version = "0.1.0";
  std::vector<std::string> capabilities = {"token_stream", "reclaim", "frame_stats"};
  double connect_timeout_s = 10.0;   ///< hello_request -> hello_reply, per handshake (Connect() makes two when the announced max_frame_bytes needs another socket cap, at most 3)
  /// hello_request -> hello_reply when the connection file names a daemon that is gone (a pid that does not run, or
  /// runs with another start time): a live daemon answers within milliseconds, so this only covers a pid of another
  /// pid namespace. Then StaleConnectionFileError.
  double stale_connect_timeout_s = 1.0;
  double request_timeout_s = 30.0;   ///< any other request -> its terminal reply
  double budget_timeout_s = 120.0;   ///< set_budget / reclaim / load_model (may reload the model)
  /// Longest silence between two messages of one generation (queueing + prompt eval + a token).
  double generate_idle_timeout_s = 120.0;
  int linger_ms = 0;
};

/// Callback receiving a typed error (RequestError, TimeoutError, DaemonUnavailableError, ...).
using ErrorCallback = std::function<void(const IgiError&)>;

/// Callbacks of one streaming generation; each runs inside Pump().
struct GenerateCallbacks {
  std::function<void(const TokenEvent&)> on_token;    ///< zero or more times, in index order
  std::function<void(const GenerateReply&)> on_done;  ///< terminal success (finish_reason may be "cancelled")
  ErrorCallback on_error;                             ///< terminal failure (error_reply, timeout, daemon gone)
};

/// Counters of what the client dropped or saw.
struct ClientCounters {
  std::uint64_t messages_received = 0;
  std::uint64_t dropped_invalid = 0;    ///< failed framing, signature or validation (spec 2)
  std::uint64_t dropped_unmatched = 0;  ///< parent_id of no outstanding request (e.g. after a timeout)
  /// error_reply flagged detail.duplicate_msg_id (spec 6.6): not the terminal reply of the request it names
  std::uint64_t dropped_duplicate_msg_id = 0;
  std::uint64_t heartbeats_sent = 0;
};

class Client {
 public:
  /// Creates the DEALER socket, connects it to `info.Endpoint()` and starts the I/O thread.
  /// No message is sent until Connect(): before it succeeds, every other request throws NotConnectedError
  /// without sending anything (hello_request must be the first message, ipc/PROTOCOL.md 9.4).
  explicit Client(ConnectionInfo info, ClientOptions options = {});
  /// Reads `connection_file` (see ReadConnectionFile) and constructs a Client.
  static std::unique_ptr<Client> FromConnectionFile(const std::string& connection_file, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // ---- blocking calls: for loading screens / setup, not per frame. Throw IgiError subclasses. ----
  /// hello handshake; starts heartbeats. Throws UnsupportedVersionError on a different major version.
  /// When the connection file names a daemon that is gone (igi/process_liveness.hpp: a daemon killed with SIGKILL left
  /// it), the first handshake waits at most options.stale_connect_timeout_s and then throws StaleConnectionFileError
  /// instead of a TimeoutError after connect_timeout_s (a daemon that answers is used: the pid may be of another pid
  /// namespace). A file a starting daemon rewrote meanwhile is not read again: make a new Client from it.
  /// Replies are then decoded with the announced limits.max_frame_bytes; when that limit needs another socket cap
  /// than the handshake ran with (ZMQ_MAXMSGSIZE = 2 x it, ipc/PROTOCOL.md 1.4), the socket is replaced by a fresh
  /// one with that cap and the handshake is repeated on it (libzmq applies the option to new connections only).
  HelloReply Connect();
  /// Opens an NPC session; returns its id (also in the reply). A request with both grammar and json_schema, or a
  /// tool name twice, throws InvalidRequestError unsent (CreateSessionRequest::Check; Generate and
  /// CreateSessionAsync do the same).
  CreateSessionReply CreateSession(const CreateSessionRequest& request);
  void CloseSession(const std::string& session_id);
  /// Sets the VRAM budget the game allows the daemon (0 = CPU only). `levels_mib` (protocol 1.3): the budget levels
  /// the game will ask for, MiB (at most kMaxBudgetLevels; e.g. menu 6144, play 2048, cutscene 0), which the daemon
  /// plans ahead so that a later change to one of them needs no planning; they change nothing else. nullopt = the
  /// levels declared before stay, empty = clear them; a daemon older than 1.3 ignores them. A negative level or too
  /// many levels throws InvalidRequestError unsent. The ack's IsInterim() (1.3): the placement in force is one planned
  /// ahead that fits the budget, and the daemon's exact plan follows in the background without another reply.
  BudgetAck SetBudget(std::int64_t vram_budget_mib, const std::string& reason = "",
                      std::optional<std::vector<std::int64_t>> levels_mib = std::nullopt);
  /// The same from a full request (its levels_mib included).
  BudgetAck SetBudget(const SetBudgetRequest& request);
  /// Urgent shrink on the daemon's priority path.
  BudgetAck Reclaim(std::int64_t vram_budget_mib, double deadline_s);
  FrameStatsReply SendFrameStats(const FrameStatsRequest& request);
  StatusReply Status();
  LoadModelReply LoadModel(const LoadModelRequest& request);

  // ---- asynchronous calls: return the request's msg_id; callbacks run inside Pump(). ----
  /// Streams one NPC reply to `request.text` in `session_id`.
  std::string Generate(const std::string& session_id, const GenerateRequest& request, GenerateCallbacks callbacks);
  /// Cancels a generation started with Generate(); its on_done then reports finish_reason "cancelled".
  std::string Cancel(const std::string& generate_msg_id, std::function<void(const CancelReply&)> on_reply = {},
                     ErrorCallback on_error = {});
  std::string SetBudgetAsync(std::int64_t vram_budget_mib, const std::string& reason,
                             std::function<void(const BudgetAck&)> on_ack, ErrorCallback on_error = {});
  /// SetBudget's asynchronous form from a full request (protocol 1.3: its levels_mib); refused unsent like SetBudget.
  std::string SetBudgetAsync(const SetBudgetRequest& request, std::function<void(const BudgetAck&)> on_ack,
                             ErrorCallback on_error = {});
  std::string FrameStatsAsync(const FrameStatsRequest& request, std::function<void(const FrameStatsReply&)> on_reply,
                              ErrorCallback on_error = {});
  std::string CreateSessionAsync(const CreateSessionRequest& request,
                                 std::function<void(const CreateSessionReply&)> on_reply, ErrorCallback on_error = {});
  std::string CloseSessionAsync(const std::string& session_id, std::function<void()> on_closed = {},
                                ErrorCallback on_error = {});

  /// Runs queued callbacks on the calling thread (call once per frame from the game thread).
  /// At most `max_callbacks` run; the rest stay queued. Returns how many ran.
  std::size_t Pump(std::size_t max_callbacks = SIZE_MAX);

  /// Drops the callbacks of a request (e.g. its owner is being destroyed), including ones already
  /// queued for Pump(); nothing more is delivered for it. Does not cancel anything on the daemon.
  void Forget(const std::string& msg_id);

  /// Called (inside Pump) once when heartbeats go unanswered for client_timeout_s. From then on every request
  /// (Connect included) throws DaemonUnavailableError at once: a restarted daemon has a new key, so connect a
  /// new Client from its connection file.
  void SetOnDisconnected(std::function<void(const IgiError&)> callback);

  /// Stops the I/O thread and fails every outstanding request with DaemonUnavailableError.
  void Close();

  bool connected() const;
  /// The hello_reply of Connect() (default-constructed before).
  HelloReply hello() const;
  ClientCounters counters() const;
  const ConnectionInfo& connection() const;
  /// The socket's inbound frame cap (ZMQ_MAXMSGSIZE): 2 x the default max_frame_bytes before Connect(), then 2 x the
  /// one hello_reply announced (-1 = none). A daemon frame over it makes libzmq drop the connection for good (a
  /// protocol error is not reconnected): the daemon is then declared gone after client_timeout_s of silence.
  std::int64_t max_msg_bytes() const;

  /// Sends any typed request and waits for its terminal reply (error_reply is thrown as RequestError).
  template <class Req, class Reply>
  Reply Call(const Req& request, const std::optional<std::string>& session_id, double timeout_s) {
    Envelope env = CallRaw(Req::kType, session_id, StructToValue(request), timeout_s);
    return StructFromValue<Reply>(env.content);
  }

  /// Sends a request of any `type` with a raw content map and waits for its terminal reply
  /// (escape hatch for message types newer than this client; error_reply is thrown).
  Envelope CallRaw(const std::string& type, const std::optional<std::string>& session_id, Value content,
                   double timeout_s);

 private:
  friend struct ClientTestAccess;  // tests/test_client_fake.cpp: lowers the heartbeat floor to stress races
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace igi
