// frame_budget.cpp - IgiClientCore, client layer: frame-rate budget helper and its Client driver.
#include "igi/frame_budget.hpp"

#include <numeric>

namespace igi {

FrameBudget::FrameBudget(FrameBudgetOptions options) : options_(options) {}

void FrameBudget::AddFrame(double frame_time_ms) {
  if (!(frame_time_ms >= 0.0)) return;  // negative or NaN: ignore
  frames_ms_.push_back(frame_time_ms);
  while (frames_ms_.size() > options_.window_frames) frames_ms_.pop_front();
}

double FrameBudget::MeanFrameTimeMs() const {
  if (frames_ms_.empty()) return 0.0;
  return std::accumulate(frames_ms_.begin(), frames_ms_.end(), 0.0) / static_cast<double>(frames_ms_.size());
}

std::optional<FrameStatsRequest> FrameBudget::PollReport(double now_s) {
  if (frames_ms_.empty()) return std::nullopt;
  if (last_report_s_ && now_s - *last_report_s_ < options_.report_interval_s) return std::nullopt;
  last_report_s_ = now_s;
  FrameStatsRequest request;
  request.frame_time_ms = MeanFrameTimeMs();
  request.target_frame_time_ms = options_.target_frame_time_ms;
  return request;
}

void FrameBudget::ApplyAdvice(const FrameStatsReply& reply) {
  throttle_ = reply.throttle;
  proposed_budget_mib_ = reply.proposed_budget_mib;
}

void FrameBudget::SetBudgetOverride(std::optional<std::int64_t> vram_budget_mib) { override_mib_ = vram_budget_mib; }

std::optional<std::int64_t> FrameBudget::TakeBudgetChange() {
  std::optional<std::int64_t> wanted = override_mib_;
  if (!wanted && options_.accept_proposals) wanted = proposed_budget_mib_;
  if (!wanted || wanted == requested_mib_) return std::nullopt;
  requested_mib_ = wanted;
  return wanted;
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
  if (budget_in_flight_.empty()) {
    std::optional<std::int64_t> mib = budget_.TakeBudgetChange();
    if (!mib && budget_.HasPendingBudgetLevels()) mib = budget_.requested_budget_mib();  // levels with the budget in force
    if (mib) {
      try {
        budget_in_flight_ = client_.SetBudgetAsync(
            SetBudgetRequest{*mib, "frame budget helper", budget_.TakeBudgetLevels()},
            [this](const BudgetAck& ack) {
              budget_in_flight_.clear();
              budget_.OnBudgetAck(ack);
              if (on_ack_) on_ack_(ack);
            },
            [this](const IgiError& e) {
              budget_in_flight_.clear();
              if (on_error_) on_error_(e);
            });
      } catch (const InvalidRequestError& e) {  // levels refused unsent (out of range, too many): reported, dropped
        if (on_error_) on_error_(e);
      }
    }
  }
}

}  // namespace igi
