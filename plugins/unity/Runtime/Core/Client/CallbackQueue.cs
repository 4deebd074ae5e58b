// Layer: core/client. Thread-safe queue of callbacks that the game drains on its main thread.
using System;
using System.Collections.Concurrent;

namespace Igi.Client
{
    /// <summary>
    /// Callbacks posted from any thread (the client's I/O thread) and run by <see cref="Pump"/> on the thread
    /// that calls it: in Unity, the main thread from Update(). No callback ever runs on the I/O thread, so
    /// game code in callbacks may touch UnityEngine objects.
    /// </summary>
    public sealed class CallbackQueue
    {
        private readonly ConcurrentQueue<Action> _queue = new ConcurrentQueue<Action>();

        /// <summary>Raised (on the pumping thread) when a callback throws; the exception does not stop the pump.</summary>
        public event Action<Exception> CallbackFailed;

        /// <summary>Callbacks waiting for <see cref="Pump"/>.</summary>
        public int Count { get { return _queue.Count; } }

        /// <summary>Queues a callback. Thread-safe.</summary>
        public void Post(Action callback)
        {
            if (callback != null) _queue.Enqueue(callback);
        }

        /// <summary>Runs up to <paramref name="maxCallbacks"/> queued callbacks on the calling thread.</summary>
        /// <returns>The number of callbacks run.</returns>
        public int Pump(int maxCallbacks = int.MaxValue)
        {
            int n = 0;
            Action callback;
            while (n < maxCallbacks && _queue.TryDequeue(out callback))
            {
                n++;
                try { callback(); }
                catch (Exception e)
                {
                    var handler = CallbackFailed;
                    if (handler == null) throw;
                    handler(e);
                }
            }
            return n;
        }
    }
}
