// frame_budget.cpp - IgiClientCore, client layer: frame-rate budget helper and its Client driver.
#include "igi/frame_budget.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace igi {

FrameBudget::FrameBudget(FrameBudgetOptions options) : options_(options) {}

double BusyFrameTimeMs(double game_thread_ms, double render_thread_ms, double gpu_ms, double interval_ms) {
  double busy = 0.0;
  for (double ms : {game_thread_ms, render_thread_ms, gpu_ms}) {
    if (ms > busy && std::isfinite(ms)) busy = ms;
  }
  return busy > 0.0 ? busy : interval_ms;
}

void FrameBudget::AddFrame(double frame_time_ms) {
  if (!(frame_time_ms >= 0.0)) return;  // negative or NaN: ignore
  frames_ms_.push_back(std::min(frame_time_ms, kMaxFrameTimeMs));
  while (frames_ms_.size() > std::max<std::size_t>(1, options_.window_frames)) frames_ms_.pop_front();
}

double FrameBudget::MeanFrameTimeMs() const {
  if (frames_ms_.empty()) return 0.0;
  return std::accumulate(frames_ms_.begin(), frames_ms_.end(), 0.0) / static_cast<double>(frames_ms_.size());
}

double FrameBudget::P95FrameTimeMs() const {
  if (frames_ms_.empty()) return 0.0;
  std::vector<double> sorted(frames_ms_.begin(), frames_ms_.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const auto rank = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(n)));  // nearest rank, 1-based
  return sorted[std::min(n, std::max<std::size_t>(1, rank)) - 1];
}

std::optional<FrameStatsRequest> FrameBudget::PollReport(double now_s) {
  if (frames_ms_.empty()) return std::nullopt;
  if (last_report_s_ && now_s - *last_report_s_ < options_.report_interval_s) return std::nullopt;
  last_report_s_ = now_s;
  FrameStatsRequest request;
  request.frame_time_ms = P95FrameTimeMs();
  request.target_frame_time_ms = options_.target_frame_time_ms;
  frames_ms_.clear();
  return request;
}

void FrameBudget::SetTargetFrameTimeMs(double target_frame_time_ms) {
  if (target_frame_time_ms >= 0.0 && std::isfinite(target_frame_time_ms)) {
    options_.target_frame_time_ms = target_frame_time_ms;
  }
}

void FrameBudget::ApplyAdvice(const FrameStatsReply& reply) {
  throttle_ = reply.throttle;
  proposed_budget_mib_ = reply.proposed_budget_mib;
}

void FrameBudget::SetBudgetOverride(std::optional<std::int64_t> vram_budget_mib) { override_mib_ = vram_budget_mib; }

std::optional<std::int64_t> FrameBudget::WantedBudgetMib() const {
  if (override_mib_) return override_mib_;
  return options_.accept_proposals ? proposed_budget_mib_ : std::nullopt;
}

std::optional<std::int64_t> FrameBudget::TakeBudgetChange() {
  std::optional<std::int64_t> wanted = WantedBudgetMib();
  if (!wanted || wanted == requested_mib_) return std::nullopt;
  requested_mib_ = wanted;
  return wanted;
}

void FrameBudget::OnBudgetFailed(std::int64_t vram_budget_mib, std::optional<std::vector<std::int64_t>> levels_mib) {
  if (requested_mib_ == vram_budget_mib) requested_mib_.reset();  // the daemon may not have it: request it again
  if (levels_mib && !pending_levels_) pending_levels_ = std::move(levels_mib);
}

void FrameBudget::DeclareBudgetLevels(std::vector<std::int64_t> levels_mib) {
  declared_levels_ = levels_mib;
  pending_levels_ = std::move(levels_mib);
}

std::optional<std::vector<std::int64_t>> FrameBudget::TakeBudgetLevels() {
  std::optional<std::vector<std::int64_t>> levels = std::move(pending_levels_);
  pending_levels_.reset();
  return levels;
}

void FrameBudget::OnBudgetAck(const BudgetAck& ack) { granted_budget_mib_ = ack.granted_mib; }

void FrameBudget::OnNewConnection() {
  requested_mib_.reset();
  granted_budget_mib_.reset();
  proposed_budget_mib_.reset();
  throttle_ = Throttle{};
  last_report_s_.reset();
  if (declared_levels_ && !declared_levels_->empty()) pending_levels_ = declared_levels_;
}

std::size_t FrameBudget::TokensPerFrame() const {
  return throttle_.tokens_per_frame ? static_cast<std::size_t>(*throttle_.tokens_per_frame) : 0;
}

std::size_t FrameBudget::PumpBudget() const {
  std::size_t cap = TokensPerFrame();
  return cap > 0 ? cap : SIZE_MAX;
}

FrameBudgetDriver::~FrameBudgetDriver() {
  if (!report_in_flight_.empty()) client_.Forget(report_in_flight_);
  if (!budget_in_flight_.empty()) client_.Forget(budget_in_flight_);
}

void FrameBudgetDriver::Tick(double frame_time_ms, double now_s) {
  budget_.AddFrame(frame_time_ms);
  if (!client_.connected()) return;
  try {
    Send(now_s);
  } catch (const IgiError& e) {  // refused unsent (the daemon declared gone meanwhile): reported, never thrown
    if (on_error_) on_error_(e);
  }
}

void FrameBudgetDriver::Send(double now_s) {
  if (report_in_flight_.empty()) {
    if (std::optional<FrameStatsRequest> report = budget_.PollReport(now_s)) {
      report_in_flight_ = client_.FrameStatsAsync(
          *report,
          [this](const FrameStatsReply& reply) {
            report_in_flight_.clear();
            budget_.ApplyAdvice(reply);
          },
          [this](const IgiError& e) {
            report_in_flight_.clear();
            if (on_error_) on_error_(e);
          });
    }
  }
  last_tick_s_ = now_s;
  // the wait after a failure holds back only the budget that failed: a newer one (a reclaim to 0, say) goes at once
  const bool backing_off = budget_retry_s_ > 0.0 && now_s < budget_retry_at_s_ && budget_.WantedBudgetMib() == budget_failed_mib_;
  if (budget_in_flight_.empty() && !backing_off) {
    std::optional<std::int64_t> mib = budget_.TakeBudgetChange();
    const bool change = mib.has_value();
    if (!mib && budget_.HasPendingBudgetLevels()) mib = budget_.requested_budget_mib();  // levels with the budget in force
    if (mib) {
      SetBudgetRequest request{*mib, "frame budget helper", budget_.TakeBudgetLevels()};
      try {
        budget_in_flight_ = client_.SetBudgetAsync(
            request,
            [this](const BudgetAck& ack) {
              budget_in_flight_.clear();
              budget_retry_s_ = 0.0;
              budget_failed_mib_.reset();
              budget_.OnBudgetAck(ack);
              if (on_ack_) on_ack_(ack);
            },
            [this, request](const IgiError& e) {  // sent again later: the daemon may not have it
              budget_in_flight_.clear();
              budget_retry_s_ = std::min(kMaxBudgetRetryS, std::max(budget_.options().report_interval_s, 2 * budget_retry_s_));
              budget_retry_at_s_ = last_tick_s_ + budget_retry_s_;  // Pump runs after the frame's Tick
              budget_failed_mib_ = request.vram_budget_mib;
              budget_.OnBudgetFailed(request.vram_budget_mib, request.levels_mib);
              if (on_error_) on_error_(e);
            });
      } catch (const InvalidRequestError& e) {  // levels refused unsent (out of range, too many): reported, dropped
        if (change) budget_.OnBudgetFailed(request.vram_budget_mib, std::nullopt);  // the budget goes next tick
        if (on_error_) on_error_(e);
      } catch (const IgiError&) {  // refused unsent otherwise (the daemon declared gone): the next daemon gets it
        if (change) budget_.OnBudgetFailed(request.vram_budget_mib, request.levels_mib);
        throw;
      }
    }
  }
}

}  // namespace igi
