// Layer: core/budget. Pure statistics over a window of frame times (no clock, no I/O).
using System;
using System.Collections.Generic;

namespace Igi.Budget
{
    /// <summary>
    /// Collects frame times until a reporting window of <see cref="WindowS"/> seconds of game time is full (or it holds
    /// <see cref="MaxFrames"/> frames), then yields its summary. The window is measured in the frames' intervals, so the
    /// class never reads a clock; the statistics are of the time each frame reports (its busy time where known).
    /// </summary>
    public sealed class FrameTimeWindow
    {
        /// <summary>Most frames a window holds: it is full at this many, and keeps only the latest this many when it is
        /// not summarised (a report still in flight), so zero-length frames never grow it without bound.</summary>
        public const int MaxFrames = 1024;

        /// <summary>Longest frame time a window records, ms (the governor reads no longer one; a longer or infinite
        /// frame is cut to it, so the p95 is always finite).</summary>
        public const double MaxFrameTimeMs = 60000.0;

        private readonly Queue<double> _frameMs = new Queue<double>();
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

        /// <summary>The window is full: <see cref="TakeSummary"/> should be called.</summary>
        public bool IsFull { get { return _elapsedS >= WindowS || _frameMs.Count >= MaxFrames; } }

        /// <summary>Adds one frame; returns true when the window is full and <see cref="TakeSummary"/> should be called.</summary>
        /// <param name="frameTimeS">The frame's duration, s (Unity: Time.unscaledDeltaTime). Negative or NaN values are ignored.</param>
        public bool AddFrame(double frameTimeS)
        {
            return AddFrame(frameTimeS, frameTimeS);
        }

        /// <summary>Adds one frame whose interval and busy time differ; returns true when the window is full.</summary>
        /// <param name="intervalS">The frame's interval, s (Unity: Time.unscaledDeltaTime): fills the window. Negative or
        /// NaN: the frame is ignored.</param>
        /// <param name="busyTimeS">The time the frame took to produce, without the wait for vsync or a frame limiter, s:
        /// what the statistics are of. Negative or NaN: the interval instead.</param>
        public bool AddFrame(double intervalS, double busyTimeS)
        {
            if (double.IsNaN(intervalS) || intervalS < 0) return false;
            double sampleS = double.IsNaN(busyTimeS) || busyTimeS < 0 ? intervalS : busyTimeS;
            _frameMs.Enqueue(Math.Min(MaxFrameTimeMs, sampleS * 1000.0));
            while (_frameMs.Count > MaxFrames) _frameMs.Dequeue();
            _elapsedS = Math.Min(_elapsedS + intervalS, double.MaxValue);
            return IsFull;
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
