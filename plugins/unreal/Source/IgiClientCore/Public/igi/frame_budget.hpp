// igi/frame_budget.hpp - IgiClientCore, client layer: frame-rate budget helper.
//
// FrameBudget is pure logic (no clock, no I/O): it collects frame times, says when a
// frame_stats_request is due (at most every report_interval_s) and what it reports (the nearest-rank
// p95 of the frames since the last report, as the Unity helper does), keeps the daemon's throttle advice
// and budget proposal, and decides which VRAM budget to request: an explicit override always wins;
// otherwise, with accept_proposals, the daemon's proposed_budget_mib. FrameBudgetDriver wires it to
// a Client: call Tick() once per frame on the game thread, before Client::Pump().
//
// Throttle advice is split (ipc/PROTOCOL.md 7.3): the daemon applies throttle.sleep_ms_between_tokens
// itself, while throttle.tokens_per_frame is applied by the client, i.e. by the game's per-frame
// Pump(). The daemon does not enforce it. So pump with PumpBudget(), never with TokensPerFrame():
//
//   driver.Tick(frame_ms, now_s);
//   client.Pump(budget.PumpBudget());  // SIZE_MAX without a cap, else tokens_per_frame callbacks
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "igi/client.hpp"
#include "igi/messages.hpp"

namespace igi {

struct FrameBudgetOptions {
  double target_frame_time_ms = 1000.0 / 60.0;
  double report_interval_s = 0.5;     ///< spec: frame_stats at most a few times per second
  std::size_t window_frames = 1024;   ///< most frames kept between two reports (the oldest go first)
  bool accept_proposals = true;       ///< follow the daemon's proposed_budget_mib when no override
};

/// Longest frame time a helper reports, ms (the governor clamps to the same; a longer or infinite one is cut to it).
inline constexpr double kMaxFrameTimeMs = 60000.0;

/// The frame's busy time from the engine's per-thread times, ms (Unreal: what `stat unit` shows as Game, Draw and
/// GPU): the longest of those above 0, which excludes the wait for vsync or a frame limiter. When none is above 0
/// (no stats yet, a null RHI), the frame interval `interval_ms` instead.
double BusyFrameTimeMs(double game_thread_ms, double render_thread_ms, double gpu_ms, double interval_ms);

class FrameBudget {
 public:
  explicit FrameBudget(FrameBudgetOptions options = {});

  /// Records one frame's time, ms (best its busy time: BusyFrameTimeMs). Negative or NaN is ignored; over
  /// kMaxFrameTimeMs is cut to it.
  void AddFrame(double frame_time_ms);
  /// A frame_stats_request when one is due at `now_s` (any monotonic seconds), else nullopt: the nearest-rank p95
  /// of the frames since the last report, which it clears; resets the report timer.
  std::optional<FrameStatsRequest> PollReport(double now_s);
  /// The frame time the game aims for, ms (0 or more; 0 asks for no advice), from the next report on.
  void SetTargetFrameTimeMs(double target_frame_time_ms);
  /// Stores the daemon's advice from a frame_stats_reply.
  void ApplyAdvice(const FrameStatsReply& reply);

  /// Explicit budget (MiB) that overrides proposals; nullopt returns control to the daemon.
  void SetBudgetOverride(std::optional<std::int64_t> vram_budget_mib);
  /// The budget to request now, when it differs from the last one requested; else nullopt.
  std::optional<std::int64_t> TakeBudgetChange();
  /// The budget the helper would ask for now (the override, else an accepted proposal), without taking it.
  std::optional<std::int64_t> WantedBudgetMib() const;
  /// A budget request (`vram_budget_mib`, sent with `levels_mib`) failed or was refused unsent: the budget counts as
  /// not requested, so TakeBudgetChange gives it again, and the levels wait to be sent again (unless newer ones were
  /// declared meanwhile). Pass nullopt as `levels_mib` to drop levels the client refused.
  void OnBudgetFailed(std::int64_t vram_budget_mib, std::optional<std::vector<std::int64_t>> levels_mib);
  /// Protocol 1.3: declares the budget levels the game will ask for, MiB (at most kMaxBudgetLevels; empty = clear
  /// them). They are sent with the next budget request, or with the budget last requested when none is due; before
  /// any budget was requested they wait for the first.
  void DeclareBudgetLevels(std::vector<std::int64_t> levels_mib);
  /// The declared levels not sent yet (and forgets them), else nullopt.
  std::optional<std::vector<std::int64_t>> TakeBudgetLevels();
  /// Levels are waiting to be sent.
  bool HasPendingBudgetLevels() const { return pending_levels_.has_value(); }
  /// The budget last requested (TakeBudgetChange), nullopt before the first.
  std::optional<std::int64_t> requested_budget_mib() const { return requested_mib_; }
  /// Records the daemon's answer to a budget request.
  void OnBudgetAck(const BudgetAck& ack);
  /// A connection to another daemon (a restart) begins: it knows nothing of this game, so the budget in force
  /// (the override, else the last proposal it makes) and the declared levels are sent to it again, and the old
  /// daemon's advice and grant are forgotten. FrameBudgetDriver calls it when it is made for a client.
  void OnNewConnection();

  /// The raw throttle.tokens_per_frame advice, with 0 meaning "no cap". Do not pass it to Client::Pump()
  /// (Pump(0) runs nothing); use PumpBudget().
  std::size_t TokensPerFrame() const;
  /// The most callbacks to run this frame: the argument of Client::Pump(). SIZE_MAX when the daemon sets
  /// no cap (tokens_per_frame nil, or 0, before the first frame_stats_reply too), else tokens_per_frame.
  std::size_t PumpBudget() const;
  const Throttle& throttle() const { return throttle_; }
  std::optional<std::int64_t> proposed_budget_mib() const { return proposed_budget_mib_; }
  std::optional<std::int64_t> granted_budget_mib() const { return granted_budget_mib_; }
  /// Mean and nearest-rank p95 of the frames since the last report, ms (0 without frames).
  double MeanFrameTimeMs() const;
  double P95FrameTimeMs() const;
  const FrameBudgetOptions& options() const { return options_; }

 private:
  FrameBudgetOptions options_;
  std::deque<double> frames_ms_;
  std::optional<double> last_report_s_;
  Throttle throttle_;
  std::optional<std::int64_t> proposed_budget_mib_;
  std::optional<std::int64_t> override_mib_;
  std::optional<std::int64_t> requested_mib_;
  std::optional<std::int64_t> granted_budget_mib_;
  std::optional<std::vector<std::int64_t>> pending_levels_;
  std::optional<std::vector<std::int64_t>> declared_levels_;  ///< the levels declared last, for a new daemon
};

/// Connects a FrameBudget to a Client: sends frame_stats and budget changes asynchronously.
class FrameBudgetDriver {
 public:
  /// A driver per connection: the budget is told a new one begins (FrameBudget::OnNewConnection).
  FrameBudgetDriver(Client& client, FrameBudget& budget) : client_(client), budget_(budget) {
    budget_.OnNewConnection();
  }
  /// Forgets its in-flight requests, so no callback can reach a destroyed driver.
  ~FrameBudgetDriver();
  FrameBudgetDriver(const FrameBudgetDriver&) = delete;
  FrameBudgetDriver& operator=(const FrameBudgetDriver&) = delete;
  /// Once per frame on the game thread: records the frame, sends a due report or budget change.
  /// Errors go to `on_error` (inside Client::Pump(), or from Tick itself for a request refused unsent: the
  /// daemon declared gone between the connected() check and the send, levels out of range); Tick never throws.
  /// A budget request that failed is sent again, first after report_interval_s, then at twice the previous wait
  /// (at most kMaxBudgetRetryS) while it keeps failing; one refused unsent for its levels goes again at once without
  /// them.
  void Tick(double frame_time_ms, double now_s);
  void SetOnError(ErrorCallback on_error) { on_error_ = std::move(on_error); }
  void SetOnBudgetAck(std::function<void(const BudgetAck&)> on_ack) { on_ack_ = std::move(on_ack); }

  static constexpr double kMaxBudgetRetryS = 30.0;  ///< longest wait before a failed budget request goes again

 private:
  void Send(double now_s);

  Client& client_;
  FrameBudget& budget_;
  std::string report_in_flight_;  ///< msg_id of the outstanding frame_stats_request, "" = none
  std::string budget_in_flight_;  ///< msg_id of the outstanding set_budget_request, "" = none
  double budget_retry_s_ = 0.0;     ///< the wait after the last failed budget request, s (0 after a success)
  double budget_retry_at_s_ = 0.0;  ///< no budget request of budget_failed_mib_ before this, s (Tick's clock)
  std::optional<std::int64_t> budget_failed_mib_;  ///< the budget whose request failed last (nullopt after a success)
  double last_tick_s_ = 0.0;        ///< Tick's `now_s` last time
  ErrorCallback on_error_;
  std::function<void(const BudgetAck&)> on_ack_;
};

}  // namespace igi
