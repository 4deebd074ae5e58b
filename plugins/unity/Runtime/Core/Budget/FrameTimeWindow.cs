// Layer: core/budget. Pure statistics over a window of frame times (no clock, no I/O).
using System;
using System.Collections.Generic;

namespace Igi.Budget
{
    /// <summary>
    /// Collects frame times until a reporting window of <see cref="WindowS"/> seconds of game time is full,
    /// then yields its summary. The window is measured in the frames' own durations, so the class never reads a clock.
    /// </summary>
    public sealed class FrameTimeWindow
    {
        private readonly List<double> _frameMs = new List<double>();
        private double _elapsedS;

        /// <summary>Creates a window.</summary>
        /// <param name="windowS">Seconds of frames per report (&gt; 0).</param>
        public FrameTimeWindow(double windowS)
        {
            if (!(windowS > 0)) throw new ArgumentOutOfRangeException("windowS", "the window must be longer than 0 s");
            WindowS = windowS;
        }

        /// <summary>Seconds of frames per report.</summary>
        public double WindowS { get; private set; }

        /// <summary>Frames in the current window.</summary>
        public int FrameCount { get { return _frameMs.Count; } }

        /// <summary>Adds one frame; returns true when the window is full and <see cref="TakeSummary"/> should be called.</summary>
        /// <param name="frameTimeS">The frame's duration, s (Unity: Time.unscaledDeltaTime). Negative or non-finite values are ignored.</param>
        public bool AddFrame(double frameTimeS)
        {
            if (double.IsNaN(frameTimeS) || double.IsInfinity(frameTimeS) || frameTimeS < 0) return false;
            _frameMs.Add(frameTimeS * 1000.0);
            _elapsedS += frameTimeS;
            return _elapsedS >= WindowS;
        }

        /// <summary>Summarises and clears the window.</summary>
        public FrameTimeSummary TakeSummary()
        {
            var summary = new FrameTimeSummary();
            int n = _frameMs.Count;
            if (n > 0)
            {
                var sorted = new List<double>(_frameMs);
                sorted.Sort();
                double sum = 0;
                foreach (double ms in sorted) sum += ms;
                summary.FrameCount = n;
                summary.MeanMs = sum / n;
                summary.P95Ms = sorted[Math.Min(n - 1, (int)Math.Ceiling(0.95 * n) - 1)];
                summary.MaxMs = sorted[n - 1];
            }
            _frameMs.Clear();
            _elapsedS = 0;
            return summary;
        }
    }

    /// <summary>Statistics of one window of frames, ms.</summary>
    public struct FrameTimeSummary
    {
        /// <summary>Frames in the window.</summary>
        public int FrameCount;
        /// <summary>Mean frame time, ms.</summary>
        public double MeanMs;
        /// <summary>95th percentile (nearest rank) frame time, ms.</summary>
        public double P95Ms;
        /// <summary>Longest frame, ms.</summary>
        public double MaxMs;
    }
}
